package ledger

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeQEMU plays a QEMU whose ledger port's chardev is a unix socket
// server (socket,server=on,wait=off): the ledger server connects to it,
// and the test reads and writes the guest's end of that stream.
type fakeQEMU struct {
	path  string
	ln    net.Listener
	conns chan net.Conn

	mu       sync.Mutex
	accepted []net.Conn
	cur      *guest // ask's
}

func newFakeQEMU(t testing.TB, path string) *fakeQEMU {
	t.Helper()
	q := &fakeQEMU{path: path}
	q.listen(t)
	t.Cleanup(q.exit)
	return q
}

func (q *fakeQEMU) listen(t testing.TB) {
	t.Helper()
	ln, err := net.Listen("unix", q.path)
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 16)
	q.ln, q.conns = ln, conns
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			q.mu.Lock()
			q.accepted = append(q.accepted, c)
			q.mu.Unlock()
			conns <- c
		}
	}()
}

// exit is QEMU exiting: its socket goes, and so do its streams.
func (q *fakeQEMU) exit() {
	q.ln.Close()
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range q.accepted {
		c.Close()
	}
	q.accepted = nil
}

// restart is QEMU exiting and starting again on the same socket path.
func (q *fakeQEMU) restart(t *testing.T) {
	q.exit()
	q.listen(t)
}

// guest is the guest's end of the port.
type guest struct {
	c net.Conn
	r *bufio.Reader
}

// next waits for the server's next connection.
func (q *fakeQEMU) next() (*guest, error) {
	select {
	case c := <-q.conns:
		return &guest{c: c, r: bufio.NewReader(c)}, nil
	case <-time.After(10 * time.Second):
		return nil, fmt.Errorf("%s: the ledger server did not connect", q.path)
	}
}

// ask asks on the machine's current stream, moving to the server's next
// connection when that stream is dead (the server was restarted).
func (q *fakeQEMU) ask(t *testing.T, req string) string {
	t.Helper()
	for range 5 {
		if q.cur == nil {
			q.cur = q.mustNext(t)
		}
		ans, err := q.cur.ask(req)
		if err == nil {
			return ans
		}
		q.cur = nil
	}
	t.Fatalf("%s: no live stream", q.path)
	return ""
}

func (q *fakeQEMU) mustNext(t *testing.T) *guest {
	t.Helper()
	g, err := q.next()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.c.Close() })
	return g
}

func (g *guest) ask(req string) (string, error) {
	g.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(g.c, "%s\n", req); err != nil {
		return "", err
	}
	line, err := g.r.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

func (g *guest) mustAsk(t *testing.T, req string) string {
	t.Helper()
	ans, err := g.ask(req)
	if err != nil {
		t.Fatalf("%s: %v", req, err)
	}
	return ans
}

type testServer struct {
	*Server
	client *Client
	done   chan error
	cancel context.CancelFunc
}

func startServer(t testing.TB, opts ServerOptions) *testServer {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.IdleExit == 0 {
		opts.IdleExit = -1
	}
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ts := &testServer{Server: srv, client: &Client{Dir: opts.Dir}, done: make(chan error, 1), cancel: cancel}
	go func() { ts.done <- srv.Run(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-ts.done:
		t.Fatalf("server: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		<-ts.done
	})
	return ts
}

func (ts *testServer) attach(t *testing.T, name, family string, q *fakeQEMU) *guest {
	t.Helper()
	if err := ts.client.Attach(t.Context(), Machine{Name: name, Family: family, Socket: q.path}); err != nil {
		t.Fatal(err)
	}
	return q.mustNext(t)
}

// TestServerRace: 8 machines of one family claim pay-42 at the same
// moment over their own sockets: one granted, seven taken naming it; a
// machine attached later is told too; another family's machine is
// granted the same key.
func TestServerRace(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, ServerOptions{Dir: filepath.Join(dir, "ledger")})
	guests := make([]*guest, 8)
	for i := range guests {
		guests[i] = ts.attach(t, fmt.Sprintf("child-%d", i), "fam", newFakeQEMU(t, filepath.Join(dir, fmt.Sprintf("c%d.sock", i))))
	}
	answers := make([]string, 8)
	errs := make([]error, 8)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, g := range guests {
		wg.Go(func() {
			<-start
			answers[i], errs[i] = g.ask("claim pay-42")
		})
	}
	close(start)
	wg.Wait()
	winner := ""
	for i, a := range answers {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if a == "granted" {
			if winner != "" {
				t.Fatalf("granted to %s and child-%d", winner, i)
			}
			winner = fmt.Sprintf("child-%d", i)
		}
	}
	if winner == "" {
		t.Fatalf("nobody granted: %q", answers)
	}
	for i, a := range answers {
		if a != "granted" && !strings.HasPrefix(a, "taken "+winner+" ") {
			t.Errorf("child-%d: got %q, want taken %s AT", i, a, winner)
		}
	}
	late := ts.attach(t, "late-child", "fam", newFakeQEMU(t, filepath.Join(dir, "late.sock")))
	if a := late.mustAsk(t, "claim pay-42"); !strings.HasPrefix(a, "taken "+winner+" ") {
		t.Errorf("a child forked later: got %q, want taken %s", a, winner)
	}
	stranger := ts.attach(t, "stranger", "other", newFakeQEMU(t, filepath.Join(dir, "s.sock")))
	if a := stranger.mustAsk(t, "claim pay-42"); a != "granted" {
		t.Errorf("another family: got %q, want granted", a)
	}
	recs, err := ts.client.List(t.Context(), "fam")
	if err != nil || len(recs) != 1 || recs[0].Holder != winner {
		t.Fatalf("list: %+v, %v", recs, err)
	}
	ms, err := ts.client.Machines(t.Context())
	if err != nil || len(ms) != 10 {
		t.Fatalf("machines: %d, %v; want 10", len(ms), err)
	}
	fi, err := os.Stat(filepath.Join(dir, "ledger", FileControl))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket: %v, %v; want mode 0600", fi.Mode(), err)
	}
}

// TestServerReconnect: the server reconnects when the stream ends and
// when QEMU starts again on the same socket (a rewind replaces the
// machine's QEMU and keeps its name: its claims are its own).
func TestServerReconnect(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, ServerOptions{Dir: filepath.Join(dir, "ledger")})
	q := newFakeQEMU(t, filepath.Join(dir, "m.sock"))
	g := ts.attach(t, "m", "fam", q)
	if a := g.mustAsk(t, "claim k"); a != "granted" {
		t.Fatalf("got %q", a)
	}
	g.c.Close()
	g = q.mustNext(t)
	if a := g.mustAsk(t, "get k"); !strings.HasPrefix(a, "claimed m ") {
		t.Fatalf("after reconnect: got %q", a)
	}
	q.restart(t)
	g = q.mustNext(t)
	if a := g.mustAsk(t, "claim k"); !strings.HasPrefix(a, "yours ") {
		t.Fatalf("after QEMU restarted: got %q, want yours AT", a)
	}
	// Attach again (the Manager does after every start): no second stream.
	if err := ts.client.Attach(t.Context(), Machine{Name: "m", Family: "fam", Socket: q.path}); err != nil {
		t.Fatal(err)
	}
	if a := g.mustAsk(t, "ping"); a != "pong" {
		t.Fatalf("got %q", a)
	}
	select {
	case c := <-q.conns:
		t.Fatalf("a second connection for the same registration: %v", c.RemoteAddr())
	case <-time.After(100 * time.Millisecond):
	}
}

// TestServerDetachDropReplace: a detached machine's stream is closed; a
// machine whose socket is gone is dropped after DropAfter; a name
// attached again with another family is served for that family only.
func TestServerDetachDropReplace(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, ServerOptions{Dir: filepath.Join(dir, "ledger"), DropAfter: 300 * time.Millisecond})
	qa := newFakeQEMU(t, filepath.Join(dir, "a.sock"))
	ga := ts.attach(t, "a", "fam", qa)
	ga.mustAsk(t, "claim k")
	if err := ts.client.Detach(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := ga.ask("ping"); err == nil {
		t.Fatal("a detached machine's stream still answers")
	}

	qb := newFakeQEMU(t, filepath.Join(dir, "b.sock"))
	gb := ts.attach(t, "b", "fam", qb)
	gb.mustAsk(t, "ping")
	qb.exit() // QEMU gone, socket file removed
	deadline := time.Now().Add(5 * time.Second)
	for len(ts.Machines()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("machine not dropped: %+v", ts.Machines())
		}
		time.Sleep(50 * time.Millisecond)
	}

	qc := newFakeQEMU(t, filepath.Join(dir, "c.sock"))
	gc := ts.attach(t, "c", "fam", qc)
	gc.mustAsk(t, "claim fam-key")
	qc2 := newFakeQEMU(t, filepath.Join(dir, "c2.sock"))
	gc2 := ts.attach(t, "c", "fam2", qc2)
	if _, err := gc.ask("ping"); err == nil {
		t.Fatal("the replaced stream still answers")
	}
	if a := gc2.mustAsk(t, "get fam-key"); a != "none" {
		t.Fatalf("the new family sees the old one's record: %q", a)
	}
}

// TestServerIdleExitAndOffline: with no machine the server exits after
// IdleExit; the Client then works on the store itself, under the lock.
func TestServerIdleExitAndOffline(t *testing.T) {
	dir := t.TempDir()
	srv, _ := NewServer(ServerOptions{Dir: filepath.Join(dir, "ledger"), IdleExit: 200 * time.Millisecond})
	done := make(chan error, 1)
	go func() { done <- srv.Run(t.Context()) }()
	<-srv.Ready()
	q := newFakeQEMU(t, filepath.Join(dir, "m.sock"))
	c := &Client{Dir: filepath.Join(dir, "ledger")}
	if err := c.Attach(t.Context(), Machine{Name: "m", Family: "fam", Socket: q.path}); err != nil {
		t.Fatal(err)
	}
	g := q.mustNext(t)
	g.mustAsk(t, "claim k1")
	g.mustAsk(t, "claim k2")
	g.mustAsk(t, "done k2 sent")
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("exited with a machine attached: %v", err)
	default:
	}
	if err := c.Detach(t.Context(), "m"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("idle server did not exit")
	}
	if err := c.Ping(t.Context()); !errors.Is(err, ErrNoServer) {
		t.Fatalf("ping after exit: got %v, want ErrNoServer", err)
	}
	// No server: the same calls, on the store.
	keys, err := c.KeysOf(t.Context(), "fam", "m")
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys of m: %v, %v", keys, err)
	}
	rel, err := c.ReleaseHeldBy(t.Context(), "fam", "m")
	if err != nil || len(rel) != 1 || rel[0].Key != "k1" {
		t.Fatalf("release held by m: %+v, %v; want k1 only", rel, err)
	}
	if _, err := c.Release(t.Context(), "fam", "k2"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(t.Context(), "fam", "k2"); !errors.Is(err, ErrNotClaimed) {
		t.Fatalf("second release: got %v, want ErrNotClaimed", err)
	}
	if _, err := c.Get(t.Context(), "fam", "nosuch"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get nosuch: got %v, want ErrNotFound", err)
	}
	recs, err := c.List(t.Context(), "fam")
	if err != nil || len(recs) != 2 || recs[0].State != Released || recs[1].State != Released {
		t.Fatalf("list: %+v, %v", recs, err)
	}
	// Without a Start, Attach says why it cannot.
	if err := c.Attach(t.Context(), Machine{Name: "m", Family: "fam", Socket: q.path}); !errors.Is(err, ErrNoServer) {
		t.Fatalf("attach with no server: got %v, want ErrNoServer", err)
	}
}

// TestServerOneInstance: a second server for the same directory sees the
// first answer and returns ErrRunning; Ensure starts one when none runs,
// and a restarted server serves the registrations it saved.
func TestServerOneInstance(t *testing.T) {
	dir := t.TempDir()
	ldir := filepath.Join(dir, "ledger")
	var mu sync.Mutex
	var servers []chan error
	ctx, cancel := context.WithCancel(t.Context())
	defer func() {
		cancel()
		<-servers[0]
	}()
	start := func(context.Context) error {
		srv, err := NewServer(ServerOptions{Dir: ldir, IdleExit: -1})
		if err != nil {
			return err
		}
		d := make(chan error, 1)
		mu.Lock()
		servers = append(servers, d)
		mu.Unlock()
		go func() { d <- srv.Run(ctx) }()
		return nil
	}
	c := &Client{Dir: ldir, Start: start}
	q := newFakeQEMU(t, filepath.Join(dir, "m.sock"))
	if err := c.Attach(t.Context(), Machine{Name: "m", Family: "fam", Socket: q.path}); err != nil {
		t.Fatal(err)
	}
	q.mustNext(t).mustAsk(t, "claim k")
	start(t.Context())
	mu.Lock()
	second := servers[1]
	mu.Unlock()
	if err := <-second; !errors.Is(err, ErrRunning) {
		t.Fatalf("second server: got %v, want ErrRunning", err)
	}
	if err := c.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	n := len(servers)
	mu.Unlock()
	if n != 2 {
		t.Fatalf("Ensure started a server while one ran (%d starts)", n)
	}
}

// TestServerRestartReattaches: a server killed and started again serves
// the machines it had (its saved registrations, or Discover's).
func TestServerRestartReattaches(t *testing.T) {
	dir := t.TempDir()
	ldir := filepath.Join(dir, "ledger")
	q := newFakeQEMU(t, filepath.Join(dir, "m.sock"))
	ts := startServer(t, ServerOptions{Dir: ldir})
	g := ts.attach(t, "m", "fam", q)
	g.mustAsk(t, "claim k")
	ts.cancel()
	<-ts.done
	ts.done <- nil // for the cleanup
	ts2 := startServer(t, ServerOptions{Dir: ldir})
	if a := q.mustNext(t).mustAsk(t, "claim k"); !strings.HasPrefix(a, "yours ") {
		t.Fatalf("after restart: got %q", a)
	}
	ts2.cancel()
	<-ts2.done
	ts2.done <- nil
	// Discover, when given, is the truth: here it names another family.
	startServer(t, ServerOptions{Dir: ldir, Discover: func(context.Context) ([]Machine, error) {
		return []Machine{{Name: "m", Family: "fam2", Socket: q.path}}, nil
	}})
	if a := q.mustNext(t).mustAsk(t, "claim k"); a != "granted" {
		t.Fatalf("discovered in another family: got %q", a)
	}
}
