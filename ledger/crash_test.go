package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// serverEnv makes the test binary a ledger server (TestMain), so that a
// test can kill -9 a real server process.
const serverEnv = "VMFORK_LEDGER_TEST_SERVER"

type childConfig struct {
	Dir      string
	Machines []Machine
	// KillAfterGrants > 0: the server SIGKILLs itself when it is about to
	// write its Nth `granted`, after the claim is synced: a crash between
	// the write and the answer.
	KillAfterGrants int32
}

func TestMain(m *testing.M) {
	if js := os.Getenv(serverEnv); js != "" {
		os.Exit(runChildServer(js))
	}
	os.Exit(m.Run())
}

func runChildServer(js string) int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	opts := ServerOptions{Dir: cfg.Dir, IdleExit: -1, Rate: fast,
		Discover: func(context.Context) ([]Machine, error) { return cfg.Machines, nil }}
	if cfg.KillAfterGrants > 0 {
		var grants atomic.Int32
		opts.dial = func(ctx context.Context, path string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", path)
			if err != nil {
				return nil, err
			}
			return &killConn{Conn: c, grants: &grants, after: cfg.KillAfterGrants}, nil
		}
	}
	srv, err := NewServer(opts)
	if err == nil {
		err = srv.Run(context.Background())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type killConn struct {
	net.Conn
	grants *atomic.Int32
	after  int32
}

func (c *killConn) Write(p []byte) (int, error) {
	if n := int32(bytes.Count(p, []byte("granted\n"))); n > 0 && c.grants.Add(n) >= c.after {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	return c.Conn.Write(p)
}

// startChild starts a server process and waits until it answers.
func startChild(t *testing.T, cfg childConfig) *exec.Cmd {
	t.Helper()
	js, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serverEnv+"="+string(js))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	c := &Client{Dir: cfg.Dir}
	for c.Ping(t.Context()) != nil {
		select {
		case <-exited:
			t.Fatal("the server process exited")
		case <-time.After(10 * time.Millisecond):
		}
	}
	cmd.Cancel = func() error { <-exited; return nil }
	return cmd
}

// kill9 kills a server process with SIGKILL and waits until it is gone.
func kill9(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Cancel()
}

// TestCrashBetweenSyncAndAnswer: the server dies after the claim is on
// disk and before `granted` reaches the guest. The guest's retry gets its
// own claim back (yours), never a second grant, and another machine sees
// it taken.
func TestCrashBetweenSyncAndAnswer(t *testing.T) {
	dir := t.TempDir()
	qa := newFakeQEMU(t, filepath.Join(dir, "a.sock"))
	qb := newFakeQEMU(t, filepath.Join(dir, "b.sock"))
	cfg := childConfig{Dir: filepath.Join(dir, "ledger"), KillAfterGrants: 1, Machines: []Machine{
		{Name: "a", Family: "fam", Socket: qa.path}, {Name: "b", Family: "fam", Socket: qb.path},
	}}
	child := startChild(t, cfg)
	ga := qa.mustNext(t)
	if ans, err := ga.ask("claim pay-42"); err == nil {
		t.Fatalf("got %q; want the server dead before it answers", ans)
	}
	kill9(t, child)
	if ps := child.ProcessState; ps == nil || ps.Success() {
		t.Fatalf("server state %v, want killed", ps)
	}
	c := &Client{Dir: cfg.Dir}
	r, err := c.Get(t.Context(), "fam", "pay-42")
	if err != nil || r.Holder != "a" || r.State != Claimed {
		t.Fatalf("on disk after the crash: %+v, %v; want claimed by a", r, err)
	}

	cfg.KillAfterGrants = 0
	startChild(t, cfg)
	if ans := qa.ask(t, "claim pay-42"); !strings.HasPrefix(ans, "yours "+stamp(r.ClaimedAt)) {
		t.Fatalf("the guest's retry: got %q, want yours %s", ans, stamp(r.ClaimedAt))
	}
	if ans := qb.ask(t, "claim pay-42"); !strings.HasPrefix(ans, "taken a ") {
		t.Fatalf("another machine: got %q, want taken a", ans)
	}
}

// TestCrashDuringBurst: 8 machines claim the same 1000 keys while the
// server is killed with SIGKILL three times and started again. A guest
// whose request went unanswered asks again on the new stream. In the
// end: every key has one holder, every `granted` and `yours` a guest saw
// is that holder's and on disk, and every `taken` names it.
func TestCrashDuringBurst(t *testing.T) {
	dir := t.TempDir()
	const machines, keys = 8, 1000
	cfg := childConfig{Dir: filepath.Join(dir, "ledger")}
	qs := make([]*fakeQEMU, machines)
	for i := range qs {
		qs[i] = newFakeQEMU(t, filepath.Join(dir, fmt.Sprintf("m%d.sock", i)))
		cfg.Machines = append(cfg.Machines, Machine{Name: fmt.Sprintf("m%d", i), Family: "fam", Socket: qs[i].path})
	}
	child := startChild(t, cfg)

	type seen struct{ machine, answer string }
	var mu sync.Mutex
	answers := map[string][]seen{}
	var retried atomic.Int32
	errs := make(chan error, machines)
	var wg sync.WaitGroup
	for i, q := range qs {
		wg.Go(func() {
			name := fmt.Sprintf("m%d", i)
			g, err := q.next()
			if err != nil {
				errs <- err
				return
			}
			for _, k := range rand.Perm(keys) {
				key := fmt.Sprintf("k%d", k)
				for {
					ans, err := g.ask("claim " + key)
					if err == nil {
						mu.Lock()
						answers[key] = append(answers[key], seen{name, ans})
						mu.Unlock()
						break
					}
					// Unanswered: the server died. Ask the next one.
					retried.Add(1)
					if g, err = q.next(); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- nil
		})
	}
	for range 3 {
		time.Sleep(time.Duration(30+rand.IntN(70)) * time.Millisecond)
		kill9(t, child)
		child = startChild(t, cfg)
	}
	wg.Wait()
	for range machines {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	kill9(t, child)

	recs, err := (&Client{Dir: cfg.Dir}).List(t.Context(), "fam")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != keys {
		t.Fatalf("%d records, want %d", len(recs), keys)
	}
	holder := map[string]string{}
	for _, r := range recs {
		holder[r.Key] = r.Holder
	}
	granted := 0
	for key, ss := range answers {
		n := 0
		for _, s := range ss {
			word, rest, _ := strings.Cut(s.answer, " ")
			switch word {
			case "granted":
				n++
				granted++
				fallthrough
			case "yours":
				if s.machine != holder[key] {
					t.Errorf("%s: %s was told %q, but the ledger says %s holds it", key, s.machine, s.answer, holder[key])
				}
			case "taken":
				if h, _, _ := strings.Cut(rest, " "); h != holder[key] {
					t.Errorf("%s: %s was told %q, but the ledger says %s holds it", key, s.machine, s.answer, holder[key])
				}
			default:
				t.Errorf("%s: %s got %q", key, s.machine, s.answer)
			}
		}
		if n > 1 {
			t.Errorf("%s granted %d times: %v", key, n, ss)
		}
	}
	t.Logf("%d keys, %d granted seen, %d requests asked again after a kill", keys, granted, retried.Load())
	if retried.Load() == 0 {
		t.Log("no request was cut by a kill this time (the burst outran the kills)")
	}
}
