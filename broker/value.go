package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmfork/vmfork/contract"
)

// ChildInfo names the machine a value is for: what an exec hook is told,
// in VMFORK_NAME, VMFORK_PARENT and VMFORK_INDEX.
type ChildInfo struct {
	Name string `json:"name"`
	// Parent is the machine it was forked from; empty for a root machine.
	Parent string `json:"parent,omitempty"`
	// Index is its place among its fork's children, 1 for the first (0
	// for a booted machine, which has no fork).
	Index int `json:"index"`
}

// Value limits.
const (
	// MaxValueBytes bounds a secret's value: it goes into one request
	// header, and servers refuse headers much larger.
	MaxValueBytes = 16 << 10
	// ResolveTimeout bounds one Resolve, whatever the caller's context
	// allows: a hook that hangs must not hold up a fork or the broker.
	ResolveTimeout = 30 * time.Second
	// maxStderrBytes bounds what of a hook's stderr is kept for its error.
	maxStderrBytes = 4 << 10
	// hookWaitDelay bounds the wait for a killed hook's pipes, should it
	// have left a child holding them.
	hookWaitDelay = 2 * time.Second
)

// ErrNoValue is wrapped by errors about a secret whose value cannot be
// had: an empty or unset environment variable, an empty file or output,
// a value too large or one that cannot go into a header.
var ErrNoValue = errors.New("no usable value")

// Resolve returns the value of secret name for child, from s.ValueFrom:
//   - exec: the command runs on the host through /bin/sh -c, with this
//     process's environment plus VMFORK_NAME, VMFORK_PARENT and
//     VMFORK_INDEX; its standard output, less one trailing newline, is the
//     value. A non-zero exit is an error carrying the (trimmed) stderr.
//   - env: env(VAR), less one trailing newline;
//   - file: the file's contents, less one trailing newline.
//
// It takes at most ResolveTimeout (less if ctx ends sooner): a hook still
// running then is killed. The value must be 1 to MaxValueBytes bytes
// with no control characters (it goes into a request header). Errors name
// the secret and the source, never the value.
func Resolve(ctx context.Context, name string, s contract.Secret, child ChildInfo, env func(string) string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, ResolveTimeout)
	defer cancel()
	var (
		v   []byte
		src string
		err error
	)
	switch from := s.ValueFrom; {
	case from.Exec != "":
		src = "value_from.exec"
		v, err = resolveExec(ctx, from.Exec, child)
	case from.Env != "":
		src = "value_from.env " + from.Env
		if env == nil {
			env = os.Getenv
		}
		v = []byte(env(from.Env))
		if len(v) == 0 {
			err = fmt.Errorf("$%s is empty or unset: %w", from.Env, ErrNoValue)
		}
	case from.File != "":
		src = "value_from.file " + from.File
		v, err = resolveFile(from.File)
	default:
		return nil, fmt.Errorf("secret %s: value_from names no source: %w", name, contract.ErrInvalid)
	}
	if err == nil {
		v = trimNewline(v)
		err = checkValue(v)
	}
	if err != nil {
		return nil, fmt.Errorf("secret %s: %s: %w", name, src, err)
	}
	return v, nil
}

func resolveExec(ctx context.Context, command string, child ChildInfo) ([]byte, error) {
	return RunHook(ctx, command, child, MaxValueBytes+2) // +2: a trailing \r\n
}

// RunHook runs an exec hook for child, as a secret's value_from.exec and a
// secret file's rotate.exec do: command through /bin/sh -c on the host, in
// /, with this process's environment plus VMFORK_NAME, VMFORK_PARENT and
// VMFORK_INDEX, in a process group of its own. It returns the hook's
// standard output as it is, at most max bytes (more is an error wrapping
// ErrNoValue). It takes at most ResolveTimeout (less if ctx ends sooner):
// a hook still running then is killed with everything it started. A
// non-zero exit is an error carrying the hook's trimmed stderr; no error
// holds the command or its output, either of which may hold the value.
func RunHook(ctx context.Context, command string, child ChildInfo, max int) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, ResolveTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	cmd.Env = append(os.Environ(),
		"VMFORK_NAME="+child.Name,
		"VMFORK_PARENT="+child.Parent,
		"VMFORK_INDEX="+strconv.Itoa(child.Index))
	cmd.Dir = "/"
	// Its own process group, so a kill reaches what the shell started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = hookWaitDelay
	var stdout, stderr boundedBuffer
	stdout.max, stderr.max = max, maxStderrBytes
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (after %v)", ctx.Err(), ResolveTimeout)
		}
		// Neither stdout nor the command: either may hold the value (a
		// command may be `echo VALUE`). Stderr is the hook's message.
		return nil, fmt.Errorf("%w: stderr=%#q", err, strings.TrimSpace(stderr.String()))
	}
	if stdout.overflow {
		return nil, fmt.Errorf("output larger than %d bytes: %w", max, ErrNoValue)
	}
	return stdout.Bytes(), nil
}

func resolveFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	v, err := io.ReadAll(io.LimitReader(f, MaxValueBytes+3))
	if err != nil {
		return nil, err
	}
	if len(v) > MaxValueBytes+2 {
		return nil, fmt.Errorf("larger than %d bytes: %w", MaxValueBytes, ErrNoValue)
	}
	return v, nil
}

// trimNewline drops one trailing newline (\n or \r\n).
func trimNewline(v []byte) []byte {
	v = bytes.TrimSuffix(v, []byte("\n"))
	return bytes.TrimSuffix(v, []byte("\r"))
}

// checkValue refuses a value that cannot be a header's (or part of one).
func checkValue(v []byte) error {
	switch {
	case len(v) == 0:
		return fmt.Errorf("empty: %w", ErrNoValue)
	case len(v) > MaxValueBytes:
		return fmt.Errorf("larger than %d bytes: %w", MaxValueBytes, ErrNoValue)
	}
	for i, c := range v {
		if (c < 0x20 && c != '\t') || c == 0x7f {
			// The offset, never the byte: it is part of the value.
			return fmt.Errorf("a control character at byte %d cannot go into a header: %w", i, ErrNoValue)
		}
	}
	return nil
}

// boundedBuffer keeps the first max bytes written to it and notes whether
// more came; it never fails a write, so the writer is never blocked. The
// buffer is a field, not embedded: an embedded bytes.Buffer's ReadFrom,
// which io.Copy (and so exec.Cmd's output copy) prefers to Write, would
// take everything.
type boundedBuffer struct {
	buf      bytes.Buffer
	max      int
	overflow bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room < len(p) {
		b.overflow = true
		if room > 0 {
			b.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *boundedBuffer) Bytes() []byte  { return b.buf.Bytes() }
func (b *boundedBuffer) String() string { return b.buf.String() }
