package mcpserver

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/ledger"
)

// LedgerLister lists a family's ledger (ledger.Client does); nil leaves
// the ledger tool out.
type LedgerLister interface {
	List(ctx context.Context, family string) ([]ledger.Record, error)
}

// Config is what a Server is made from.
type Config struct {
	Manager *vmfork.Manager
	Limits  Limits
	Ledger  LedgerLister
	Version string
}

// Server is vmfork's MCP server for one agent.
type Server struct {
	mg     *vmfork.Manager
	lim    Limits
	own    *owned
	ledger LedgerLister
	srv    *mcp.Server
	// calls counts tool calls in flight, so that a server whose client
	// went away returns only once every cancelled call has undone its
	// work (Wait).
	calls sync.WaitGroup
	seq   atomic.Int64
}

// New checks cfg's limits, opens the agent's ownership file and returns a
// Server with every tool registered.
func New(cfg Config) (*Server, error) {
	lim := cfg.Limits.WithDefaults()
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	if lim.Contract != nil {
		if err := lim.Contract.Validate(); err != nil {
			return nil, fmt.Errorf("--contract: %w", err)
		}
	}
	own, err := openOwned(cfg.Manager.Store, lim.Agent)
	if err != nil {
		return nil, err
	}
	s := &Server{mg: cfg.Manager, lim: lim, own: own, ledger: cfg.Ledger}
	version := cfg.Version
	if version == "" {
		version = "dev"
	}
	s.srv = mcp.NewServer(&mcp.Implementation{Name: "vmfork", Title: "vmfork: fork(2) for VMs", Version: version}, &mcp.ServerOptions{
		Instructions: instructions(lim),
	})
	s.register()
	return s, nil
}

// MCP returns the underlying MCP server, to run on a transport.
func (s *Server) MCP() *mcp.Server { return s.srv }

// Limits returns the limits in force, defaults filled in.
func (s *Server) Limits() Limits { return s.lim }

// Run serves one client on t (stdio: &mcp.StdioTransport{}) until it goes
// away, then waits for the calls it left to finish undoing their work.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	err := s.srv.Run(ctx, t)
	s.calls.Wait()
	return err
}

// Wait returns once no tool call is in flight.
func (s *Server) Wait() { s.calls.Wait() }

func instructions(l Limits) string {
	return fmt.Sprintf(`vmfork forks running virtual machines: fork a source into children that continue from the same instant, run commands in them (exec), keep the best (explore), checkpoint and rewind. `+
		`Limits set by the operator: sources %v (read-only: fork them, read their files); at most %d machines held, %d made per call; every machine gets a TTL (default %s, at most %s) and is removed when it passes. `+
		`You see and touch only machines you made. A refusal by a limit says "limit NAME:".`,
		l.Sources, l.MaxMachines, l.MaxChildren, l.TTLDefault, l.TTLMax)
}

// tool wraps a handler so that the server waits for it (Run) and so that
// a panic in one call is that call's error, not the server's end.
func tool[In any](s *Server, t *mcp.Tool, h func(ctx context.Context, req *mcp.CallToolRequest, in In) (any, error)) {
	mcp.AddTool(s.srv, t, func(ctx context.Context, req *mcp.CallToolRequest, in In) (res *mcp.CallToolResult, out any, err error) {
		s.calls.Add(1)
		defer s.calls.Done()
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("%s: internal error: %v", t.Name, p)
			}
		}()
		out, err = h(ctx, req, in)
		return nil, out, err
	})
}

// progress returns a function that reports progress of a call to its
// client, if the client asked for it (a progress token); else a no-op.
func progress(ctx context.Context, req *mcp.CallToolRequest) func(done, total int, msg string) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return func(int, int, string) {}
	}
	var mu sync.Mutex
	return func(done, total int, msg string) {
		mu.Lock()
		defer mu.Unlock()
		// A client that went away gets no progress; the call goes on to
		// its own end.
		_ = req.Session.NotifyProgress(context.WithoutCancel(ctx), &mcp.ProgressNotificationParams{
			ProgressToken: token, Progress: float64(done), Total: float64(total), Message: msg,
		})
	}
}

// forkTrace reports a fork's children as progress: one step when the
// source is frozen, one per child ready or failed.
func forkTrace(ctx context.Context, report func(done, total int, msg string), n int) context.Context {
	var done atomic.Int64
	total := n + 1
	return vmfork.WithForkTrace(ctx, &vmfork.ForkTrace{
		SourceFrozen: func(i vmfork.FrozenInfo) {
			report(int(done.Add(1)), total, fmt.Sprintf("%s frozen (paused %d ms)", i.Source, i.Pause.Milliseconds()))
		},
		ChildReady: func(i vmfork.ChildReadyInfo) {
			report(int(done.Add(1)), total, fmt.Sprintf("%s ready", i.Name))
		},
		ChildFailed: func(i vmfork.ChildFailedInfo) {
			report(int(done.Add(1)), total, fmt.Sprintf("%s failed", i.Child))
		},
	})
}
