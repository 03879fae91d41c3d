package mcpserver

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmfork/vmfork"
)

// The tools that reach into a guest through its agent: exec, read_file,
// write_file. Output an agent reads is bounded (Limits.OutputBytes): the
// tail is kept, and the full length said.

// ExecIn is the exec tool's input.
type ExecIn struct {
	Machine  string   `json:"machine" jsonschema:"a running machine you made"`
	Command  []string `json:"command" jsonschema:"program and arguments, e.g. [\"sh\",\"-c\",\"make test\"]; the program is looked up on the guest's PATH"`
	Stdin    string   `json:"stdin,omitempty" jsonschema:"text sent to the command's standard input"`
	Env      []string `json:"env,omitempty" jsonschema:"environment variables for the command, each as KEY=VALUE"`
	TimeoutS float64  `json:"timeout_s,omitempty" jsonschema:"seconds to wait for the command (default 300)"`
}

// ReadFileIn is the read_file tool's input.
type ReadFileIn struct {
	Machine string `json:"machine" jsonschema:"a running machine you made, or a source the operator gave"`
	Path    string `json:"path" jsonschema:"absolute path in the guest"`
}

// WriteFileIn is the write_file tool's input.
type WriteFileIn struct {
	Machine  string `json:"machine" jsonschema:"a running machine you made"`
	Path     string `json:"path" jsonschema:"absolute path in the guest; the file is replaced whole"`
	Content  string `json:"content" jsonschema:"the file's new content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (default) or base64"`
}

// defaultExecTimeout bounds an exec whose call names no timeout.
const defaultExecTimeout = 5 * time.Minute

func (s *Server) registerGuest() {
	tool(s, &mcp.Tool{Name: "exec", Description: "Run a command in a machine you made, through its guest agent (no network or SSH needed), and wait for it to exit. " +
		"Returns exit_code, the tails of stdout and stderr (bounded by the operator) and their full lengths in bytes."}, s.exec)
	tool(s, &mcp.Tool{Name: "read_file", Description: "Read a file from a running machine (one you made, or a source the operator gave). Text comes back as utf-8, anything else as base64 (encoding says which).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.readFile)
	tool(s, &mcp.Tool{Name: "write_file", Description: "Replace a file in a running machine you made with the given content."}, s.writeFile)
}

func (s *Server) exec(ctx context.Context, req *mcp.CallToolRequest, in ExecIn) (any, error) {
	if err := s.checkOwned(in.Machine); err != nil {
		return nil, err
	}
	if len(in.Command) == 0 || in.Command[0] == "" {
		return nil, fmt.Errorf("exec: command: give a program and its arguments: %w", vmfork.ErrInvalid)
	}
	if err := s.lim.checkExec(in.Command); err != nil {
		return nil, err
	}
	for _, kv := range in.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("exec: env %q: want KEY=VALUE: %w", kv, vmfork.ErrInvalid)
		}
	}
	timeout := defaultExecTimeout
	if in.TimeoutS < 0 {
		return nil, fmt.Errorf("exec: timeout_s %v: want a positive number: %w", in.TimeoutS, vmfork.ErrInvalid)
	} else if in.TimeoutS > 0 {
		timeout = time.Duration(in.TimeoutS * float64(time.Second))
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	st, err := s.mg.Exec(ctx, in.Machine, vmfork.ExecRequest{Argv: in.Command, Env: in.Env, Stdin: []byte(in.Stdin)})
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return nil, fmt.Errorf("exec in %q: %q did not exit within %s (it may still run in the guest)", in.Machine, in.Command[0], timeout)
	}
	if err != nil {
		return nil, err
	}
	n := s.lim.OutputBytes
	return map[string]any{
		"exit_code":    st.ExitCode,
		"signal":       st.Signal,
		"stdout_tail":  tail(st.Stdout, n),
		"stderr_tail":  tail(st.Stderr, n),
		"stdout_bytes": len(st.Stdout),
		"stderr_bytes": len(st.Stderr),
		"duration_ms":  float64(time.Since(start).Microseconds()) / 1000,
	}, nil
}

// tail is the last n bytes of b as text, starting at a rune boundary.
func tail(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	b = b[len(b)-n:]
	i := 0
	for i < len(b) && i < utf8.UTFMax && !utf8.RuneStart(b[i]) {
		i++
	}
	return string(b[i:])
}

// running returns machine name's record if it runs.
func (s *Server) running(ctx context.Context, name string) (*vmfork.Machine, error) {
	m, err := s.mg.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	if m.State != vmfork.StateRunning {
		return nil, fmt.Errorf("machine %q is %s: %w", name, m.State, vmfork.ErrNotRunning)
	}
	return m, nil
}

func checkGuestPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("path %q: want an absolute guest path: %w", p, vmfork.ErrInvalid)
	}
	return nil
}

func (s *Server) readFile(ctx context.Context, req *mcp.CallToolRequest, in ReadFileIn) (any, error) {
	if err := vmfork.ValidateName(in.Machine); err != nil {
		return nil, err
	}
	if !s.lim.isSource(in.Machine) && !s.own.owns("machine", in.Machine) {
		return nil, s.notOwned(in.Machine)
	}
	if err := checkGuestPath(in.Path); err != nil {
		return nil, err
	}
	m, err := s.running(ctx, in.Machine)
	if err != nil {
		return nil, fmt.Errorf("read_file: %w", err)
	}
	agent, err := s.mg.Driver.Agent(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("read_file %q: %w", in.Machine, err)
	}
	defer agent.Close()
	data, err := agent.ReadFile(ctx, in.Path)
	if err != nil {
		return nil, fmt.Errorf("read_file %s:%s: %w", in.Machine, in.Path, err)
	}
	if len(data) > s.lim.FileBytes {
		return nil, limitErr("file-bytes", "%s:%s is %d bytes; the operator allows %d per file", in.Machine, in.Path, len(data), s.lim.FileBytes)
	}
	out := map[string]any{"machine": in.Machine, "path": in.Path, "size_bytes": len(data), "encoding": "utf-8", "content": string(data)}
	if !utf8.Valid(data) {
		out["encoding"], out["content"] = "base64", base64.StdEncoding.EncodeToString(data)
	}
	return out, nil
}

func (s *Server) writeFile(ctx context.Context, req *mcp.CallToolRequest, in WriteFileIn) (any, error) {
	if err := s.checkOwned(in.Machine); err != nil {
		return nil, err
	}
	if err := checkGuestPath(in.Path); err != nil {
		return nil, err
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "utf-8":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, fmt.Errorf("write_file: content: not base64: %v: %w", err, vmfork.ErrInvalid)
		}
	default:
		return nil, fmt.Errorf("write_file: encoding %q: want utf-8 or base64: %w", in.Encoding, vmfork.ErrInvalid)
	}
	if len(data) > s.lim.FileBytes {
		return nil, limitErr("file-bytes", "%d bytes for %s; the operator allows %d per file", len(data), in.Path, s.lim.FileBytes)
	}
	m, err := s.running(ctx, in.Machine)
	if err != nil {
		return nil, fmt.Errorf("write_file: %w", err)
	}
	agent, err := s.mg.Driver.Agent(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("write_file %q: %w", in.Machine, err)
	}
	defer agent.Close()
	if err := agent.WriteFile(ctx, in.Path, data); err != nil {
		return nil, fmt.Errorf("write_file %s:%s: %w", in.Machine, in.Path, err)
	}
	return map[string]any{"machine": in.Machine, "path": in.Path, "size_bytes": len(data)}, nil
}
