package vmfork

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/vmfork/vmfork/ledger"
)

// fakeLedger records the Manager's calls.
type fakeLedger struct {
	mu       sync.Mutex
	calls    []string // "attach NAME" / "detach NAME"
	attached map[string]ledger.Machine
	fail     error
}

func (f *fakeLedger) Attach(_ context.Context, m ledger.Machine) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "attach "+m.Name)
	if f.fail != nil {
		return f.fail
	}
	if f.attached == nil {
		f.attached = map[string]ledger.Machine{}
	}
	f.attached[m.Name] = m
	return nil
}

func (f *fakeLedger) Detach(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "detach "+name)
	delete(f.attached, name)
	return nil
}

func (f *fakeLedger) KeysOf(context.Context, string, string) ([]ledger.Record, error) {
	return nil, nil
}

func (f *fakeLedger) ReleaseHeldBy(context.Context, string, string) ([]ledger.Record, error) {
	return nil, nil
}

// take returns the calls so far, sorted (children start in parallel), and
// forgets them.
func (f *fakeLedger) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Sorted(slices.Values(f.calls))
	f.calls = nil
	return out
}

// Every start of a machine's QEMU attaches it to the ledger with its family
// and socket, every stop or removal detaches it.
func TestLedgerAttachDetach(t *testing.T) {
	mg, _ := newHibManager(t)
	fl := &fakeLedger{}
	mg.Ledger = fl
	ctx := t.Context()
	expect := func(what string, want ...string) {
		t.Helper()
		if got := fl.take(); !slices.Equal(got, want) {
			t.Errorf("%s: ledger calls %q, want %q", what, got, want)
		}
	}
	bootFake(t, mg, "web")
	expect("boot", "attach web")
	web, _ := mg.Store.LoadMachine("web")
	if lm := fl.attached["web"]; lm.Family != web.Family || lm.Socket != web.Paths.Dir+"/ledger.sock" || !web.Spec.LedgerPort {
		t.Errorf("web attached as %+v; record family %q, dir %s, port %v", lm, web.Family, web.Paths.Dir, web.Spec.LedgerPort)
	}
	if _, err := mg.Fork(ctx, ForkRequest{Source: "web", Names: []string{"a", "b"}, Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	expect("fork", "attach a", "attach b")
	for _, n := range []string{"a", "b"} {
		c, _ := mg.Store.LoadMachine(n)
		if lm := fl.attached[n]; lm.Family != web.Family || lm.Socket != c.Paths.Dir+"/ledger.sock" || lm.Socket == web.Paths.Ledger {
			t.Errorf("%s attached as %+v, want web's family %q and its own socket", n, lm, web.Family)
		}
	}
	if _, err := mg.Checkpoint(ctx, CheckpointRequest{Machine: "a", Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	expect("checkpoint") // the machine's QEMU runs on
	if _, err := mg.Rewind(ctx, RewindRequest{Machine: "a", To: "a-cp1", Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	expect("rewind", "attach a")
	if _, err := mg.Hibernate(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	expect("hibernate", "detach b")
	if _, err := mg.Resume(ctx, ResumeRequest{Machine: "b", Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	expect("resume", "attach b")
	if _, err := mg.Stop(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	expect("stop", "detach a")
	if err := mg.Remove(ctx, "b", true); err != nil {
		t.Fatal(err)
	}
	expect("rm", "detach b")
}

// A ledger that cannot be reached fails no fork: each child is named in a
// warning, and runs.
func TestLedgerAttachFailureWarns(t *testing.T) {
	mg, _ := newTestManager(t)
	l, hook := logtest.NewNullLogger()
	mg.Log = logrus.NewEntry(l)
	bootFake(t, mg, "web")
	mg.Ledger = &fakeLedger{fail: errors.New("ledger: attach: no server")}
	res, err := mg.Fork(t.Context(), ForkRequest{Source: "web", Names: []string{"a", "b"}, Identity: quietChain})
	if err != nil || len(res.Children) != 2 {
		t.Fatalf("fork with an unreachable ledger: %+v, %v; want both children", res, err)
	}
	warned := map[string]bool{}
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel && strings.Contains(e.Message, "ledger") {
			warned[e.Data["machine"].(string)] = true
		}
	}
	if !warned["a"] || !warned["b"] {
		t.Errorf("warnings for %v, want a and b", warned)
	}
}

// A machine made before the ledger port (no Spec.LedgerPort) is never
// registered, nor are its children: they have no port either.
func TestLedgerOldMachineHasNoPort(t *testing.T) {
	mg, _ := newTestManager(t)
	bootFake(t, mg, "old")
	m, _ := mg.Store.LoadMachine("old")
	m.Spec.LedgerPort, m.Paths.Ledger = false, ""
	if err := mg.Store.SaveMachine(m); err != nil {
		t.Fatal(err)
	}
	fl := &fakeLedger{}
	mg.Ledger = fl
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "old", Names: []string{"c"}, Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	c, _ := mg.Store.LoadMachine("c")
	if got := fl.take(); len(got) != 0 || c.Spec.LedgerPort || c.LedgerSocket() != "" {
		t.Errorf("ledger calls %q, child's port %v %q: want none", got, c.Spec.LedgerPort, c.LedgerSocket())
	}
}

// LedgerMachines lists the running machines whose ledger socket exists.
func TestLedgerMachines(t *testing.T) {
	mg, _ := newTestManager(t)
	for _, n := range []string{"web", "db"} {
		bootFake(t, mg, n)
	}
	web, _ := mg.Store.LoadMachine("web")
	ln, err := net.Listen("unix", web.Paths.Ledger)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got, err := mg.Store.LedgerMachines()
	want := []ledger.Machine{{Name: "web", Family: web.Family, Socket: web.Paths.Ledger}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("LedgerMachines = %+v, %v; want %+v", got, err, want)
	}
}

// An explore lists each try's claims, and releases those a losing branch
// holds and has not done when it removes it; its done ones, and the
// winner's claims, stay. The ledger is a real one, reached by the Client
// with no server (it then opens the store itself).
func TestExploreReleasesLosersClaims(t *testing.T) {
	mg, _ := newExploreManager(t)
	dir := t.TempDir()
	src, err := mg.Store.LoadMachine("src")
	if err != nil {
		t.Fatal(err)
	}
	fam := familyOf(src)
	st, err := ledger.OpenStore(dir, ledger.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]string{{"src-try-1", "k"}, {"src-try-1", "d"}, {"src-try-3", "w"}} {
		if _, err := st.Claim(fam, c[0], c[1]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Done(fam, "src-try-1", "d", "r1"); err != nil {
		t.Fatal(err)
	}
	st.Close()
	mg.Ledger = &ledger.Client{Dir: dir}
	res, err := mg.Explore(t.Context(), ExploreRequest{
		Source: "src", Tries: []string{"exit 3", "exit 4", "echo yes"}, Identity: fakeGuestIdentity,
	})
	if err != nil {
		t.Fatal(err)
	}
	t1, t3 := res.Tries[0], res.Tries[2]
	want1 := []TryClaim{{Key: "d", State: "done", Result: "r1"}, {Key: "k", State: "released"}}
	if !slices.Equal(t1.Claims, want1) || !slices.Equal(t1.Released, []string{"k"}) {
		t.Errorf("loser: claims %+v released %q; want %+v and [k]", t1.Claims, t1.Released, want1)
	}
	if !slices.Equal(t3.Claims, []TryClaim{{Key: "w", State: "claimed"}}) || len(t3.Released) != 0 {
		t.Errorf("winner: claims %+v released %q; want w claimed, none released", t3.Claims, t3.Released)
	}
	recs, err := mg.Ledger.(*ledger.Client).List(t.Context(), fam)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]ledger.State{}
	for _, r := range recs {
		states[r.Key] = r.State
	}
	if states["k"] != ledger.Released || states["d"] != ledger.Done || states["w"] != ledger.Claimed {
		t.Errorf("ledger after the explore: %v; want k released, d done, w claimed", states)
	}
}
