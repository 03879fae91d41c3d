//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An MCP client of `vmfork mcp` for the tests: the Go SDK's own client,
// over stdio (the server a subprocess, as an agent's host starts it) or
// over streamable HTTP on a unix socket.

// mcpArgs is the vmfork command line of a server for agent with extra
// limit flags.
func (e *env) mcpArgs(agent string, extra ...string) []string {
	return append([]string{"--state-dir", e.stateDir, "--mem-dir", e.memDir, "mcp", "--agent", agent}, extra...)
}

func (e *env) mcpCommand(agent string, extra ...string) *exec.Cmd {
	cmd := exec.Command(e.bin, e.mcpArgs(agent, extra...)...)
	cmd.Env = append(os.Environ(), e.extraEnv...)
	cmd.Stderr = &prefixWriter{t: e.t, prefix: "mcp " + agent + ": "}
	return cmd
}

// prefixWriter logs a server's stderr through t, a line at a time.
type prefixWriter struct {
	t      testing.TB
	prefix string
	mu     sync.Mutex
	done   bool
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
			w.t.Log(w.prefix + l)
		}
	}
	return len(p), nil
}

// mcpClient is one client session with the progress it was sent.
type mcpClient struct {
	t        testing.TB
	sess     *mcp.ClientSession
	mu       sync.Mutex
	progress []string
	// onProgress, if set, is called with each progress message.
	onProgress func(msg string)
}

func newMCPClient(t testing.TB) (*mcpClient, *mcp.Client) {
	c := &mcpClient{t: t}
	cl := mcp.NewClient(&mcp.Implementation{Name: "vmfork-tests", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress = append(c.progress, r.Params.Message)
			f := c.onProgress
			c.mu.Unlock()
			if f != nil {
				f(r.Params.Message)
			}
		},
	})
	return c, cl
}

// mcpStdio starts a server for agent over stdio and connects to it; the
// session closes (and the server exits) when the test ends.
func (e *env) mcpStdio(agent string, extra ...string) *mcpClient {
	e.t.Helper()
	c, cl := newMCPClient(e.t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := cl.Connect(ctx, &mcp.CommandTransport{Command: e.mcpCommand(agent, extra...)}, nil)
	if err != nil {
		e.t.Fatalf("connect to vmfork mcp: %v", err)
	}
	c.sess = sess
	e.t.Cleanup(func() { sess.Close() })
	return c
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// unixHTTP is an HTTP client whose every connection goes to socket.
func unixHTTP(socket, token string) *http.Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}
	return &http.Client{Transport: bearer{token: token, next: tr}}
}

// mcpHTTP starts a server for agent on a unix socket with token and
// returns the socket; the server is stopped when the test ends.
func (e *env) mcpHTTP(agent, token string, extra ...string) string {
	e.t.Helper()
	sock := filepath.Join(e.t.TempDir(), "mcp.sock")
	cmd := e.mcpCommand(agent, append([]string{"--listen", "unix:" + sock}, extra...)...)
	cmd.Env = append(cmd.Env, "VMFORK_MCP_TOKEN="+token)
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	if !waitFor(15*time.Second, func() bool { _, err := os.Stat(sock); return err == nil }) {
		e.t.Fatalf("vmfork mcp --listen unix:%s: no socket after 15 s", sock)
	}
	return sock
}

// connectHTTP connects a client to the server on socket with token.
func connectHTTP(t testing.TB, socket, token string) (*mcpClient, error) {
	c, cl := newMCPClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://vmfork/", HTTPClient: unixHTTP(socket, token), MaxRetries: -1}, nil)
	if err != nil {
		return nil, err
	}
	c.sess = sess
	t.Cleanup(func() { sess.Close() })
	return c, nil
}

// callRaw calls tool name with args, asking for progress.
func (c *mcpClient) callRaw(name string, args map[string]any) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	p.SetProgressToken(name + "-progress")
	return c.sess.CallTool(ctx, p)
}

// text is a result's text content.
func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// call calls tool name and decodes its structured result into out (nil:
// discard); it fails the test on a tool error.
func (c *mcpClient) call(out any, name string, args map[string]any) {
	c.t.Helper()
	r, err := c.callRaw(name, args)
	if err != nil {
		c.t.Fatalf("%s %v: %v", name, args, err)
	}
	if r.IsError {
		c.t.Fatalf("%s %v: tool error: %s", name, args, text(r))
	}
	if out == nil {
		return
	}
	data, err := json.Marshal(r.StructuredContent)
	if err == nil {
		err = json.Unmarshal(data, out)
	}
	if err != nil {
		c.t.Fatalf("%s: result %s: %v", name, text(r), err)
	}
}

// refused calls tool name and fails the test unless the call is a tool
// error naming limit.
func (c *mcpClient) refused(limit, name string, args map[string]any) string {
	c.t.Helper()
	r, err := c.callRaw(name, args)
	if err != nil {
		c.t.Fatalf("%s %v: %v", name, args, err)
	}
	want := "limit " + limit + ":"
	if !r.IsError || !strings.Contains(text(r), want) {
		c.t.Fatalf("%s %v: want a tool error naming %q, got error=%v %s", name, args, want, r.IsError, text(r))
	}
	return text(r)
}

// mcpFork is the fork tool's result.
type mcpFork struct {
	Children []struct {
		Name    string  `json:"name"`
		ReadyMS float64 `json:"ready_ms"`
	} `json:"children"`
	PauseMS float64 `json:"pause_ms"`
	Error   string  `json:"error"`
}

func (f mcpFork) names() []string {
	var out []string
	for _, c := range f.Children {
		out = append(out, c.Name)
	}
	return out
}

// machineNames lists the machines of the env, by the CLI (which also
// repairs what a dead command left).
func (e *env) machineNames() map[string]string {
	e.t.Helper()
	out := map[string]string{}
	for _, m := range e.list() {
		out[m.Name] = m.State
	}
	return out
}

func (e *env) sameMachines(before map[string]string, what string) {
	e.t.Helper()
	after := e.machineNames()
	if fmt.Sprint(after) != fmt.Sprint(before) {
		e.t.Fatalf("%s changed the machines: before %v, after %v", what, before, after)
	}
}
