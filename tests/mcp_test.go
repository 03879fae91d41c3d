//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCP drives `vmfork mcp` with real MCP clients against one booted
// source: the Go SDK's client over stdio and streamable HTTP, the
// TypeScript SDK's (tests/mcp-client) over stdio. Every operator limit is
// tried from the client side and must be refused by name with nothing
// changed; a client killed mid-fork leaves no half-made machine; a
// machine the agent made goes at its TTL with the server stopped.
func TestMCP(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.stopReapersOnCleanup()
	e.boot("src")
	ctFile := filepath.Join(t.TempDir(), "contract.yaml")
	if err := os.WriteFile(ctFile, []byte("network:\n  egress: all\n  connections: reset\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	limits := []string{"--source", "src", "--max-machines", "3", "--max-children", "3", "--ttl", "10m", "--ttl-max", "20m", "--contract", ctFile}

	t.Run("stdio", func(t *testing.T) { mcpScenario(t, e.withT(t), limits) })
	t.Run("http", func(t *testing.T) { mcpHTTPScenario(t, e.withT(t), limits) })
	t.Run("killed-client", func(t *testing.T) { mcpKilledClient(t, e.withT(t), limits) })
	t.Run("ttl", func(t *testing.T) { mcpTTL(t, e.withT(t)) })
	t.Run("typescript", func(t *testing.T) { mcpTypeScript(t, e.withT(t), limits) })
}

// withT is e reporting to t (a subtest); cleanups stay e's.
func (e *env) withT(t testing.TB) *env {
	f := *e
	f.t = t
	return &f
}

func mcpScenario(t *testing.T, e *env, limits []string) {
	c := e.mcpStdio("lim", limits...)
	tools, err := c.sess.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.Description == "" || tl.InputSchema == nil {
			t.Errorf("tool %s has no description or input schema", tl.Name)
		}
	}
	for _, want := range []string{"fork", "exec", "read_file", "write_file", "explore", "checkpoint", "rewind", "ls", "tree", "rm", "ledger"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools/list: no %q in %v", want, names)
		}
	}

	// Every limit, before anything is made: refused by name, nothing changed.
	before := e.machineNames()
	c.refused("source", "fork", map[string]any{"source": "elsewhere"})
	c.refused("max-children", "fork", map[string]any{"source": "src", "count": 4})
	c.refused("ttl-max", "fork", map[string]any{"source": "src", "ttl_s": 3600})
	c.refused("contract", "fork", map[string]any{"source": "src", "contract": map[string]any{"network": map[string]any{"egress": "all", "connections": "keep"}}})
	c.refused("owner", "exec", map[string]any{"machine": "src", "command": []string{"true"}})
	c.refused("owner", "write_file", map[string]any{"machine": "src", "path": "/tmp/x", "content": "x"})
	c.refused("owner", "rm", map[string]any{"names": []string{"src"}})
	c.refused("owner", "checkpoint", map[string]any{"machine": "src"})
	c.refused("max-children", "explore", map[string]any{"source": "src", "tries": []string{"true", "true", "true", "true"}})
	e.sameMachines(before, "refused calls")

	// Fork 3 children of the running source, exec in each.
	var fr mcpFork
	c.call(&fr, "fork", map[string]any{"source": "src", "count": 3})
	kids := fr.names()
	if len(kids) != 3 {
		t.Fatalf("fork: want 3 children, got %+v", fr)
	}
	c.mu.Lock()
	if len(c.progress) < 4 {
		t.Errorf("fork: want a progress notification for the freeze and each child, got %q", c.progress)
	}
	c.mu.Unlock()
	hosts := map[string]bool{}
	for _, k := range kids {
		var out struct {
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout_tail"`
		}
		c.call(&out, "exec", map[string]any{"machine": k, "command": []string{"hostname"}})
		hosts[strings.TrimSpace(out.Stdout)] = true
		if out.ExitCode != 0 {
			t.Errorf("exec hostname in %s: %+v", k, out)
		}
	}
	if len(hosts) != 3 {
		t.Errorf("three children, hostnames %v", hosts)
	}
	before = e.machineNames()
	c.refused("max-machines", "fork", map[string]any{"source": kids[0]})

	// Another agent sees none of them; a restarted server still does.
	other := e.mcpStdio("other", limits...)
	other.refused("owner", "exec", map[string]any{"machine": kids[0], "command": []string{"true"}})
	other.refused("owner", "rm", map[string]any{"names": []string{kids[1]}})
	other.refused("source", "fork", map[string]any{"source": kids[0]})
	var ols struct {
		Machines []MachineView `json:"machines"`
	}
	other.call(&ols, "ls", nil)
	if len(ols.Machines) != 1 || ols.Machines[0].Name != "src" {
		t.Errorf("another agent's ls: want only the source, got %+v", ols.Machines)
	}
	c.sess.Close()
	c = e.mcpStdio("lim", limits...)
	var ls struct {
		Machines []MachineView `json:"machines"`
	}
	c.call(&ls, "ls", nil)
	if len(ls.Machines) != 4 {
		t.Errorf("ls after a restart: want the source and 3 children, got %+v", ls.Machines)
	}
	for _, m := range ls.Machines {
		if m.Name != "src" && (m.TTLLeftS <= 0 || m.TTLLeftS > 600) {
			t.Errorf("%s: TTL left %v s, want the default 10m", m.Name, m.TTLLeftS)
		}
	}
	e.sameMachines(before, "refused calls")

	// Checkpoint, change, rewind: the change is gone.
	var cp struct {
		Checkpoint string `json:"checkpoint"`
	}
	c.call(&cp, "checkpoint", map[string]any{"machine": kids[0]})
	c.call(nil, "write_file", map[string]any{"machine": kids[0], "path": "/tmp/marker", "content": "after the checkpoint"})
	var rf struct {
		Content string `json:"content"`
	}
	c.call(&rf, "read_file", map[string]any{"machine": kids[0], "path": "/tmp/marker"})
	if rf.Content != "after the checkpoint" {
		t.Fatalf("read_file: %q", rf.Content)
	}
	c.call(nil, "rewind", map[string]any{"machine": kids[0], "to": cp.Checkpoint})
	if r, err := c.callRaw("read_file", map[string]any{"machine": kids[0], "path": "/tmp/marker"}); err != nil || !r.IsError {
		t.Errorf("read_file after the rewind: want an error (no such file), got %v %s", err, text(r))
	}

	// Explore with a score: the branch that wrote more wins and is kept.
	c.call(nil, "rm", map[string]any{"names": kids[1:]})
	var ex struct {
		Result struct {
			Winner    string   `json:"winner"`
			WinnerTry int      `json:"winner_try"`
			Removed   []string `json:"removed"`
		} `json:"result"`
		Error string `json:"error"`
	}
	c.call(&ex, "explore", map[string]any{"source": "src", "tries": []string{"echo abcdef > /tmp/out", "echo a > /tmp/out"}, "score": "wc -c < /tmp/out"})
	if ex.Result.WinnerTry != 1 || ex.Result.Winner == "" || len(ex.Result.Removed) != 1 {
		t.Fatalf("explore: want try 1 to win and the other branch removed, got %+v", ex)
	}
	var tree struct {
		Roots []json.RawMessage `json:"roots"`
	}
	c.call(&tree, "tree", nil)
	if len(tree.Roots) != 1 || !strings.Contains(string(tree.Roots[0]), ex.Result.Winner) {
		t.Errorf("tree: want src's family with %s, got %s", ex.Result.Winner, tree.Roots)
	}
	c.call(nil, "ledger", map[string]any{"name": ex.Result.Winner})

	// Clean up: every machine the agent made goes, and its checkpoint.
	c.call(nil, "rm", map[string]any{"names": []string{kids[0], ex.Result.Winner}})
	c.call(&ls, "ls", nil)
	if got := e.machineNames(); len(got) != 1 || got["src"] != "running" {
		t.Errorf("after rm: want only the source, got %v", got)
	}
}

// MachineView is ls's machine (mcpserver.MachineView).
type MachineView struct {
	Name     string  `json:"name"`
	State    string  `json:"state"`
	Source   bool    `json:"source"`
	TTLLeftS float64 `json:"ttl_left_s"`
}

func mcpHTTPScenario(t *testing.T, e *env, limits []string) {
	const token = "test-token-0123456789abcdef"
	sock := e.mcpHTTP("web", token, limits...)
	if _, err := connectHTTP(t, sock, "wrong-token-0123456789"); err == nil {
		t.Fatal("a client with the wrong bearer token connected")
	}
	c, err := connectHTTP(t, sock, token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.sess.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	before := e.machineNames()
	c.refused("ttl-max", "fork", map[string]any{"source": "src", "ttl_s": 1300})
	e.sameMachines(before, "a refused call over HTTP")
	var fr mcpFork
	c.call(&fr, "fork", map[string]any{"source": "src", "names": []string{"web-a"}})
	var out struct {
		Stdout string `json:"stdout_tail"`
		Bytes  int    `json:"stdout_bytes"`
	}
	c.call(&out, "exec", map[string]any{"machine": "web-a", "command": []string{"sh", "-c", "seq 1 5000"}})
	if out.Bytes <= 4096 || len(out.Stdout) > 4096 || !strings.HasSuffix(out.Stdout, "5000\n") {
		t.Errorf("exec: want the last 4096 bytes of %d, got %d bytes ending %q", out.Bytes, len(out.Stdout), out.Stdout[max(0, len(out.Stdout)-10):])
	}
	c.call(nil, "rm", map[string]any{"names": []string{"web-a"}})
}

// mcpKilledClient kills the client once the source is frozen: the
// server's calls are cancelled, and no half-made machine stays.
func mcpKilledClient(t *testing.T, e *env, limits []string) {
	cmd := e.mcpCommand("kill", limits...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c, cl := newMCPClient(t)
	frozen := make(chan struct{}, 1)
	c.onProgress = func(msg string) {
		if strings.Contains(msg, "frozen") {
			select {
			case frozen <- struct{}{}:
			default:
			}
		}
	}
	sess, err := cl.Connect(context.Background(), &mcp.IOTransport{Reader: stdout, Writer: stdin}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.sess = sess
	go c.callRaw("fork", map[string]any{"source": "src", "count": 3})
	select {
	case <-frozen:
	case <-time.After(2 * time.Minute):
		t.Fatal("no progress from the fork in 2 minutes")
	}
	// The client dies: its ends of the pipes close.
	stdin.Close()
	stdout.(io.Closer).Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Logf("the server exited (%v) after its client's death; machines: %v", err, e.machineNames())
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatal("vmfork mcp did not exit within 2 minutes of its client's death")
	}
	for name, st := range e.machineNames() {
		if st != "running" {
			t.Errorf("after the killed client: %s is %s", name, st)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(e.stateDir, "journal")); len(ents) > 0 {
		t.Errorf("after the killed client: %d journal entries left", len(ents))
	}
	if got, want := len(e.qemuProcesses()), len(e.machineNames()); got != want {
		t.Errorf("after the killed client: %d QEMU processes for %d machines", got, want)
	}
	// Whatever did come up is the agent's, and goes.
	var names []string
	for n := range e.machineNames() {
		if n != "src" {
			names = append(names, n)
		}
	}
	if len(names) > 0 {
		e.ok(append([]string{"rm", "--force"}, names...)...)
	}
}

// mcpTTL: a child whose TTL passes with the server stopped is removed.
func mcpTTL(t *testing.T, e *env) {
	c := e.mcpStdio("ttl", "--source", "src", "--ttl", "3s", "--ttl-max", "5s")
	var fr mcpFork
	c.call(&fr, "fork", map[string]any{"source": "src"})
	if len(fr.Children) != 1 {
		t.Fatalf("fork: %+v", fr)
	}
	c.sess.Close()
	dir := filepath.Join(e.stateDir, "machines", fr.Children[0].Name)
	if !waitFor(30*time.Second, func() bool { _, err := os.Stat(dir); return os.IsNotExist(err) }) {
		t.Fatalf("%s still there 30 s after its 3 s TTL, the server stopped", fr.Children[0].Name)
	}
}

// mcpTypeScript runs the same scenario from the TypeScript SDK's client
// (tests/mcp-client/scenario.mjs, installed by make deps).
func mcpTypeScript(t *testing.T, e *env, limits []string) {
	dir, _ := filepath.Abs("mcp-client")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the TypeScript MCP client is not installed (make deps runs npm ci in tests/mcp-client): %v", err)
	}
	cmd := exec.Command("node", filepath.Join(dir, "scenario.mjs"))
	args, _ := json.Marshal(append([]string{e.bin}, e.mcpArgs("ts", limits...)...))
	cmd.Env = append(os.Environ(), "VMFORK_MCP_COMMAND="+string(args))
	out, err := cmd.CombinedOutput()
	t.Logf("scenario.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the TypeScript client's scenario failed: %v", err)
	}
	if got := e.machineNames(); len(got) != 1 {
		t.Errorf("after the TypeScript client: want only the source, got %v", got)
	}
}
