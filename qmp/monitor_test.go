package qmp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// dial connects to a fake and closes the monitor when the test ends, before the fake stops.
func dial(t *testing.T, script ...qmptest.Step) *qmp.Monitor {
	t.Helper()
	sock := qmptest.NewServer(t, script...)
	m, err := qmp.Dial(t.Context(), sock)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestDialHandshake(t *testing.T) {
	m := dial(t)
	g := m.Greeting()
	if got, want := g.Version.String(), "7.2.22"; got != want {
		t.Errorf("greeting version: got %q, want %q", got, want)
	}
	if got, want := g.Version.Package, "Debian 1:7.2+dfsg-7+deb12u18"; got != want {
		t.Errorf("greeting package: got %q, want %q", got, want)
	}
	if !slices.Contains(g.Capabilities, "oob") {
		t.Errorf("greeting capabilities: got %v, want oob listed", g.Capabilities)
	}
	if err := m.Err(); err != nil {
		t.Errorf("Err on an open monitor: got %v, want nil", err)
	}
}

func TestDialNoSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing.sock")
	_, err := qmp.Dial(t.Context(), path)
	if err == nil {
		t.Fatal("Dial: got nil error, want one")
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("Dial error: got %q, want it to name %s", err, path)
	}
}

// A socket that accepts but never greets (QEMU wedged at startup) must not hang Dial.
func TestDialGreetingTimeout(t *testing.T) {
	dir, err := os.MkdirTemp("", "qmp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	})

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = qmp.Dial(ctx, path)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial: got %v, want context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("Dial returned after %v, want about 50ms", elapsed)
	}
}

func TestExecuteSuccess(t *testing.T) {
	m := dial(t,
		qmptest.Expect("query-name").Return(map[string]string{"name": "web"}),
		qmptest.Expect("human-monitor-command").
			WithArgs(map[string]string{"command-line": "info version"}).
			Return("7.2.22\r\n"),
	)
	var r struct {
		Name string `json:"name"`
	}
	if err := m.Execute(t.Context(), "query-name", nil, &r); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if r.Name != "web" {
		t.Errorf("query-name: got %q, want %q", r.Name, "web")
	}
	var out string
	if err := m.Execute(t.Context(), "human-monitor-command", map[string]string{"command-line": "info version"}, &out); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if out != "7.2.22\r\n" {
		t.Errorf("human-monitor-command: got %q, want %q", out, "7.2.22\r\n")
	}
}

func TestExecuteError(t *testing.T) {
	m := dial(t,
		qmptest.Expect("x-nonsense").Fail("CommandNotFound", "The command x-nonsense has not been found"),
		qmptest.Expect("migrate-incoming").Fail("GenericError", "Parameter 'uri' expects a valid migration protocol"),
	)
	err := m.Execute(t.Context(), "x-nonsense", nil, nil)
	if !errors.Is(err, qmp.ErrCommandNotFound) {
		t.Errorf("errors.Is(%v, ErrCommandNotFound): got false, want true", err)
	}
	if errors.Is(err, qmp.ErrGenericError) {
		t.Errorf("errors.Is(%v, ErrGenericError): got true, want false", err)
	}
	var qerr *qmp.Error
	if !errors.As(err, &qerr) {
		t.Fatalf("errors.As(%v, *qmp.Error): got false, want true", err)
	}
	want := qmp.Error{Command: "x-nonsense", Class: "CommandNotFound", Desc: "The command x-nonsense has not been found"}
	if *qerr != want {
		t.Errorf("error: got %+v, want %+v", *qerr, want)
	}

	err = m.Execute(t.Context(), "migrate-incoming", map[string]string{"uri": "file:/tmp/x"}, nil)
	if !errors.Is(err, qmp.ErrGenericError) {
		t.Errorf("errors.Is(%v, ErrGenericError): got false, want true", err)
	}
	if got, want := err.Error(), "qmp: migrate-incoming: Parameter 'uri' expects a valid migration protocol (GenericError)"; got != want {
		t.Errorf("message: got %q, want %q", got, want)
	}
}

// QEMU 7.2's query-qmp-schema reply is one 207 000-byte line; go-qemu's scanner dies on it.
func TestLargeReply(t *testing.T) {
	big := strings.Repeat("x", 300<<10)
	m := dial(t,
		qmptest.Expect("query-qmp-schema").Return([]string{big}),
		qmptest.Expect("query-status").Return(map[string]any{"status": "running", "running": true}),
	)
	var schema []string
	if err := m.Execute(t.Context(), "query-qmp-schema", nil, &schema); err != nil {
		t.Fatalf("query-qmp-schema: %v", err)
	}
	if len(schema) != 1 || len(schema[0]) != len(big) {
		t.Errorf("reply: got %d entries, want 1 of %d bytes", len(schema), len(big))
	}
	st, err := m.QueryStatus(t.Context())
	if err != nil {
		t.Fatalf("QueryStatus after a large reply: %v", err)
	}
	if st.Status != qmp.StatusRunning {
		t.Errorf("status: got %q, want %q", st.Status, qmp.StatusRunning)
	}
}

// A subscriber that reads nothing must not delay replies: 1000 events arrive before the reply.
func TestEventsDoNotStallReplies(t *testing.T) {
	const n = 1000
	evs := make([]qmptest.Event, n)
	for i := range evs {
		evs[i] = qmptest.Event{Name: "BLOCK_IO_ERROR", Data: map[string]int{"seq": i}}
	}
	m := dial(t, qmptest.Expect("stop").EventsFirst(evs...))

	events, err := m.Events(t.Context())
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := m.Stop(ctx); err != nil {
		t.Fatalf("Stop with %d unread events: %v", n, err)
	}
	for i := range n {
		select {
		case ev := <-events:
			var d struct{ Seq int }
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatalf("event %d data: %v", i, err)
			}
			if ev.Name != "BLOCK_IO_ERROR" || d.Seq != i {
				t.Fatalf("event %d: got %s seq %d, want BLOCK_IO_ERROR seq %d", i, ev.Name, d.Seq, i)
			}
			if ev.Timestamp.IsZero() {
				t.Fatalf("event %d: zero timestamp", i)
			}
		case <-ctx.Done():
			t.Fatalf("event %d: %v", i, ctx.Err())
		}
	}
}

// Subscribing before the command catches an event that QEMU sends right after the reply.
func TestWaitEvent(t *testing.T) {
	m := dial(t,
		qmptest.Expect("stop"),
		qmptest.Emit(qmptest.Event{Name: "RESUME"}, qmptest.Event{Name: qmp.EventStop}),
	)
	events, err := m.Events(t.Context())
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	if err := m.Stop(t.Context()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	ev, err := qmp.WaitEvent(t.Context(), events, qmp.EventStop)
	if err != nil {
		t.Fatalf("WaitEvent: %v", err)
	}
	if ev.Name != qmp.EventStop {
		t.Errorf("event: got %q, want %q", ev.Name, qmp.EventStop)
	}
}

// The late reply of a cancelled command must not answer the next one.
func TestCancelledCommandLateReply(t *testing.T) {
	m := dial(t,
		qmptest.Expect("query-name").Return(map[string]string{"name": "stale"}).Late(),
		qmptest.Expect("query-name").Return(map[string]string{"name": "fresh"}),
	)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err := m.Execute(ctx, "query-name", nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first query-name: got %v, want context.DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), "query-name") {
		t.Errorf("error %q does not name the command", err)
	}
	var r struct {
		Name string `json:"name"`
	}
	if err := m.Execute(t.Context(), "query-name", nil, &r); err != nil {
		t.Fatalf("second query-name: %v", err)
	}
	if r.Name != "fresh" {
		t.Errorf("second query-name: got %q, want %q", r.Name, "fresh")
	}
}

// Concurrent callers each get the reply to their own id.
func TestConcurrentExecute(t *testing.T) {
	const n = 20
	var script []qmptest.Step
	for i := range n {
		script = append(script, qmptest.Expect("query-name").Return(map[string]string{"name": fmt.Sprint(i)}))
	}
	m := dial(t, script...)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen = map[string]bool{}
		errs []error
	)
	for range n {
		wg.Go(func() {
			var r struct{ Name string }
			err := m.Execute(t.Context(), "query-name", nil, &r)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			seen[r.Name] = true
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("Execute: %v", errors.Join(errs...))
	}
	if len(seen) != n {
		t.Errorf("distinct replies: got %d, want %d", len(seen), n)
	}
}

func TestDisconnect(t *testing.T) {
	m := dial(t,
		qmptest.Expect("stop").NoReply(),
		qmptest.Disconnect(),
	)
	err := m.Stop(t.Context())
	if !errors.Is(err, qmp.ErrClosed) {
		t.Fatalf("Stop: got %v, want ErrClosed", err)
	}
	if !strings.Contains(err.Error(), "qmp: stop:") {
		t.Errorf("error %q does not name the command", err)
	}
	select {
	case <-m.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after QEMU disconnected")
	}
	if !errors.Is(m.Err(), io.EOF) {
		t.Errorf("Err: got %v, want it to wrap io.EOF", m.Err())
	}
	if err := m.Cont(t.Context()); !errors.Is(err, qmp.ErrClosed) {
		t.Errorf("Cont after disconnect: got %v, want ErrClosed", err)
	}
	if _, err := m.Events(t.Context()); !errors.Is(err, qmp.ErrClosed) {
		t.Errorf("Events after disconnect: got %v, want ErrClosed", err)
	}
}

// Events already queued when QEMU exits are delivered before the channel closes.
func TestEventsFlushedOnDisconnect(t *testing.T) {
	release := make(chan struct{})
	m := dial(t,
		qmptest.Wait(release),
		qmptest.Emit(qmptest.Event{Name: qmp.EventShutdown, Data: map[string]any{"guest": true}}),
		qmptest.Disconnect(),
	)
	events, err := m.Events(t.Context())
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	close(release)
	<-m.Done()
	var names []string
	for ev := range events {
		names = append(names, ev.Name)
	}
	if want := []string{qmp.EventShutdown}; !slices.Equal(names, want) {
		t.Errorf("events: got %v, want %v", names, want)
	}
}

func TestCloseIdempotent(t *testing.T) {
	arrived := make(chan struct{})
	m := dial(t, qmptest.Expect("stop").NoReply().CheckArgs(func(json.RawMessage) error {
		close(arrived)
		return nil
	}))
	errc := make(chan error, 1)
	go func() { errc <- m.Stop(t.Context()) }()
	<-arrived // Close must interrupt a pending call
	if err := m.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := <-errc; !errors.Is(err, qmp.ErrClosed) {
		t.Errorf("pending Stop: got %v, want ErrClosed", err)
	}
	select {
	case <-m.Done():
	default:
		t.Error("Done not closed after Close")
	}
}

func TestExecuteWithFile(t *testing.T) {
	const content = "device state goes here"
	path := filepath.Join(t.TempDir(), "devstate")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	got := make(chan string, 1)
	m := dial(t,
		qmptest.Expect("getfd").WithArgs(map[string]string{"fdname": "mig"}).ReceiveFD(func(pf *os.File) error {
			b, err := io.ReadAll(pf)
			got <- string(b)
			return err
		}),
		qmptest.Expect("closefd").WithArgs(map[string]string{"fdname": "mig"}),
	)
	if err := qmp.GetFD(t.Context(), m, "mig", f); err != nil {
		t.Fatalf("GetFD: %v", err)
	}
	select {
	case s := <-got:
		if s != content {
			t.Errorf("passed file: got %q, want %q", s, content)
		}
	default:
		t.Error("the fake received no file")
	}
	if err := qmp.CloseFD(t.Context(), m, "mig"); err != nil {
		t.Fatalf("CloseFD: %v", err)
	}
}
