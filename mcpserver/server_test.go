package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qmp"
)

// noDriver fails every call: the refusals below must come before the
// Manager reaches a driver. Records of another driver's name are not
// refreshed through it (Manager.refreshState).
type noDriver struct{}

var errNoDriver = errors.New("the test driver was called")

func (noDriver) Name() string                                      { return "none" }
func (noDriver) Start(context.Context, *vmfork.Machine) error      { return errNoDriver }
func (noDriver) Stop(context.Context, *vmfork.Machine, bool) error { return errNoDriver }
func (noDriver) Status(context.Context, *vmfork.Machine) (vmfork.State, error) {
	return "", errNoDriver
}
func (noDriver) Agent(context.Context, *vmfork.Machine) (*qmp.Agent, error) { return nil, errNoDriver }

type fixture struct {
	t     *testing.T
	store *vmfork.Store
	mg    *vmfork.Manager
}

func newFixture(t *testing.T) *fixture {
	store, err := vmfork.OpenStore(t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, store: store, mg: vmfork.NewManager(store, noDriver{}, nil)}
}

func (f *fixture) machine(name string, created time.Time) {
	f.t.Helper()
	if err := os.MkdirAll(filepath.Join(f.store.StateDir, "machines", name), 0o700); err != nil {
		f.t.Fatal(err)
	}
	if err := f.store.SaveMachine(&vmfork.Machine{Name: name, Driver: "qemu", State: vmfork.StateRunning, Created: created}); err != nil {
		f.t.Fatal(err)
	}
}

// connect starts a Server with lim and connects a client in memory.
func (f *fixture) connect(lim Limits) (*Server, *mcp.ClientSession) {
	f.t.Helper()
	s, err := New(Config{Manager: f.mg, Limits: lim})
	if err != nil {
		f.t.Fatal(err)
	}
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := s.MCP().Connect(ctx, st, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { cs.Close(); ss.Close() })
	return s, cs
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), r.IsError
}

func refusedBy(t *testing.T, cs *mcp.ClientSession, limit, name string, args map[string]any) {
	t.Helper()
	txt, isErr := call(t, cs, name, args)
	if !isErr || !strings.Contains(txt, "limit "+limit+":") {
		t.Errorf("%s %v: want a refusal naming %s, got error=%v %s", name, args, limit, isErr, txt)
	}
}

func TestServerLimits(t *testing.T) {
	f := newFixture(t)
	now := time.Now()
	f.machine("web", now.Add(-time.Hour))
	f.machine("theirs", now.Add(-time.Hour))
	lim := Limits{Agent: "bot", Sources: []string{"web"}, MaxMachines: 1, MaxChildren: 2, TTLMax: time.Hour}
	s, cs := f.connect(lim)
	// The agent made bot-1: noted pending, then its record appears.
	release, err := s.own.reserve(1, 1, []string{"bot-1"}, "machine", "")
	if err != nil {
		t.Fatal(err)
	}
	f.machine("bot-1", time.Now())
	release()

	refusedBy(t, cs, "source", "fork", map[string]any{"source": "theirs"})
	refusedBy(t, cs, "max-children", "fork", map[string]any{"source": "web", "count": 3})
	refusedBy(t, cs, "max-machines", "fork", map[string]any{"source": "web"})
	refusedBy(t, cs, "ttl-max", "fork", map[string]any{"source": "web", "ttl_s": 7200})
	refusedBy(t, cs, "source", "fork", map[string]any{"source": "bot-1", "names": []string{"web"}})
	refusedBy(t, cs, "owner", "exec", map[string]any{"machine": "theirs", "command": []string{"true"}})
	refusedBy(t, cs, "owner", "exec", map[string]any{"machine": "web", "command": []string{"true"}})
	refusedBy(t, cs, "owner", "read_file", map[string]any{"machine": "theirs", "path": "/etc/hostname"})
	refusedBy(t, cs, "owner", "rm", map[string]any{"names": []string{"bot-1", "theirs"}})
	refusedBy(t, cs, "owner", "rewind", map[string]any{"machine": "theirs", "to": "x"})
	refusedBy(t, cs, "owner", "rewind", map[string]any{"machine": "bot-1", "to": "web"})
	refusedBy(t, cs, "owner", "tree", map[string]any{"name": "theirs"})
	for _, n := range []string{"web", "theirs", "bot-1"} {
		if _, err := f.store.LoadMachine(n); err != nil {
			t.Errorf("after the refusals: %s: %v", n, err)
		}
	}

	txt, isErr := call(t, cs, "ls", nil)
	var ls struct {
		Machines []MachineView `json:"machines"`
	}
	if isErr || json.Unmarshal([]byte(txt), &ls) != nil {
		t.Fatalf("ls: %s", txt)
	}
	var names []string
	for _, m := range ls.Machines {
		names = append(names, m.Name)
	}
	if strings.Join(names, ",") != "bot-1,web" {
		t.Errorf("ls: want bot-1 and the source web, got %v", names)
	}

	// A restarted server knows bot-1; a machine made again under the
	// name by someone else is not the agent's.
	s2, err := New(Config{Manager: f.mg, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	if !s2.own.owns("machine", "bot-1") {
		t.Error("a restarted server does not know bot-1")
	}
	f.machine("bot-1", time.Now().Add(time.Minute))
	if s2.own.owns("machine", "bot-1") {
		t.Error("bot-1 made again by someone else still counts as the agent's")
	}
}

func TestServerExecAllowExplore(t *testing.T) {
	f := newFixture(t)
	f.machine("web", time.Now())
	_, cs := f.connect(Limits{Sources: []string{"web"}, ExecAllow: []string{"python3"}})
	refusedBy(t, cs, "exec-allow", "explore", map[string]any{"source": "web", "tries": []string{"true"}})
	refusedBy(t, cs, "contract", "fork", map[string]any{"source": "web", "contract": map[string]any{
		"secrets": map[string]any{"T": map[string]any{"hosts": []string{"x.example.com"}, "value_from": map[string]any{"exec": "id"}}},
	}})
}
