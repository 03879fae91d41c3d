package vmfork

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmfork/vmfork/customize"
)

// customizeStep is an identity step that calls fn.
func customizeStep(fn func()) customize.Step {
	return customize.Step{Name: "t.call", Fn: func(context.Context, *customize.Env) error { fn(); return nil }}
}

// countStarts sets a reaper starter on mg that only counts its calls.
func countStarts(mg *Manager) *atomic.Int32 {
	var n atomic.Int32
	mg.Reaper = func(context.Context) error { n.Add(1); return nil }
	return &n
}

func TestSetTTLStoresTheDeadlineAndStartsTheReaper(t *testing.T) {
	mg, _ := newTestManager(t)
	starts := countStarts(mg)
	bootFake(t, mg, "a")
	before := time.Now()
	d, err := mg.SetTTL(t.Context(), "a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if d.Before(before.Add(time.Hour-time.Second)) || d.After(time.Now().Add(time.Hour+time.Second)) {
		t.Errorf("deadline %v, want an hour from %v", d, before)
	}
	m, err := mg.Store.LoadMachine("a")
	if err != nil || !m.Expires.Equal(d) {
		t.Fatalf("record expires %v, %v; want %v", m.Expires, err, d)
	}
	if got := starts.Load(); got != 1 {
		t.Errorf("reaper started %d times, want 1", got)
	}
	// Clearing the deadline needs no reaper.
	if d, err := mg.SetTTL(t.Context(), "a", 0); err != nil || !d.IsZero() {
		t.Errorf("SetTTL 0 = %v, %v; want no deadline", d, err)
	}
	if got := starts.Load(); got != 1 {
		t.Errorf("reaper started %d times after clearing, want still 1", got)
	}
	for _, bad := range []time.Duration{-time.Second, MaxTTL + time.Hour} {
		if _, err := mg.SetTTL(t.Context(), "a", bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetTTL(%v) = %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := mg.SetTTL(t.Context(), "nope", time.Hour); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetTTL of a missing machine = %v, want ErrNotFound", err)
	}
}

// A reaper that holds the lock is not started twice.
func TestEnsureReaperStartsNoSecondReaper(t *testing.T) {
	mg, _ := newTestManager(t)
	starts := countStarts(mg)
	unlock, ok, err := mg.Store.tryReaperLock(mg.Driver.Name())
	if err != nil || !ok {
		t.Fatalf("tryReaperLock = %v, %v", ok, err)
	}
	if err := mg.EnsureReaper(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := starts.Load(); got != 0 {
		t.Errorf("reaper started %d times while one holds the lock, want 0", got)
	}
	unlock()
	if err := mg.EnsureReaper(t.Context()); err != nil || starts.Load() != 1 {
		t.Errorf("EnsureReaper with the lock free: %d starts, %v; want 1", starts.Load(), err)
	}
}

func TestReapRemovesOnlyWhatIsDue(t *testing.T) {
	mg, d := newTestManager(t)
	countStarts(mg)
	for _, n := range []string{"due", "later", "forever"} {
		bootFake(t, mg, n)
	}
	dueAt, _ := mg.SetTTL(t.Context(), "due", time.Minute)
	laterAt, _ := mg.SetTTL(t.Context(), "later", time.Hour)
	res, err := mg.Reap(t.Context(), time.Now())
	if err != nil || len(res.Removed) != 0 || res.Pending != 2 || !res.Next.Equal(dueAt) {
		t.Fatalf("Reap now = %+v, %v; want nothing removed, 2 pending, next %v", res, err, dueAt)
	}
	res, err = mg.Reap(t.Context(), dueAt.Add(time.Millisecond))
	if err != nil || len(res.Removed) != 1 || res.Removed[0] != "due" || res.Pending != 1 || !res.Next.Equal(laterAt) {
		t.Fatalf("Reap after the first deadline = %+v, %v; want due removed, later pending", res, err)
	}
	if got := machineNames(t, mg.Store); got != "forever,later" {
		t.Errorf("machines = %s, want forever,later", got)
	}
	if d.running["due"] {
		t.Errorf("the expired machine's process still runs")
	}
	// An extend moves the deadline past the next round.
	if _, err := mg.SetTTL(t.Context(), "later", 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, _ := mg.Reap(t.Context(), laterAt.Add(time.Minute)); len(res.Removed) != 0 {
		t.Errorf("Reap after an extend removed %v, want nothing", res.Removed)
	}
	// Years later, the machine without a TTL is still there.
	res, _ = mg.Reap(t.Context(), time.Now().Add(10*MaxTTL))
	if got := machineNames(t, mg.Store); got != "forever" || res.Pending != 0 {
		t.Errorf("machines = %s, pending %d; want forever alone and nothing pending", got, res.Pending)
	}
}

// A kept template's TTL gives its name up; it goes with its last child.
func TestReapReleasesAnExpiredKeptTemplate(t *testing.T) {
	mg, _ := newTestManager(t)
	d := &linkDriver{fakeDriver: newFakeDriver()}
	mg.Driver = d
	countStarts(mg)
	bootFake(t, mg, "src")
	if _, err := mg.Keep(t.Context(), KeepRequest{Source: "src", Name: "gold"}); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "gold", Names: []string{"kid"}, Identity: okChain}); err != nil {
		t.Fatal(err)
	}
	exp, err := mg.SetTTL(t.Context(), "gold", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res, err := mg.Reap(t.Context(), exp)
	if err != nil || len(res.Released) != 1 || res.Released[0] != "gold" {
		t.Fatalf("Reap = %+v, %v; want gold released", res, err)
	}
	if _, err := mg.Store.FindKept("gold"); !errors.Is(err, ErrNotFound) {
		t.Errorf("FindKept after expiry = %v, want ErrNotFound", err)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirTemplates)); n != 1 {
		t.Errorf("%d templates while its child lives, want 1", n)
	}
	if err := mg.Remove(t.Context(), "kid", false); err != nil {
		t.Fatal(err)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirTemplates)); n != 0 {
		t.Errorf("%d templates after its last child went, want 0", n)
	}
}

// The branches of an explore whose process died are removed; those of a
// live one are not.
func TestReapRemovesBranchesOfADeadExplore(t *testing.T) {
	mg, _ := newTestManager(t)
	for _, n := range []string{"b-1", "b-2", "other"} {
		bootFake(t, mg, n)
	}
	rec, err := mg.Store.newExplore("src", []string{"b-1", "b-2", "gone"})
	if err != nil {
		t.Fatal(err)
	}
	res, _ := mg.Reap(t.Context(), time.Now())
	if len(res.Removed) != 0 || res.Pending != 1 {
		t.Fatalf("Reap with the explore alive = %+v, want nothing removed, 1 pending", res)
	}
	rec.PID = 1 << 30 // no such process
	if err := rec.save(); err != nil {
		t.Fatal(err)
	}
	res, err = mg.Reap(t.Context(), time.Now())
	if err != nil || len(res.Removed) != 2 || res.Pending != 0 {
		t.Fatalf("Reap after the explore died = %+v, %v; want b-1 and b-2 removed", res, err)
	}
	if got := machineNames(t, mg.Store); got != "other" {
		t.Errorf("machines = %s, want other", got)
	}
	if _, err := os.Stat(rec.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("explore record left: %v", err)
	}
}

// The reaper process removes a machine at its deadline, then exits and
// leaves neither its PID file nor a lock held.
func TestRunReaperExitsWhenNothingIsLeft(t *testing.T) {
	mg, _ := newTestManager(t)
	countStarts(mg)
	bootFake(t, mg, "short")
	bootFake(t, mg, "stays")
	if _, err := mg.SetTTL(t.Context(), "short", 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := mg.RunReaper(ctx, 10*time.Millisecond); err != nil {
		t.Fatalf("RunReaper = %v, want it to return once nothing is left", err)
	}
	if got := machineNames(t, mg.Store); got != "stays" {
		t.Errorf("machines = %s, want stays", got)
	}
	if _, err := os.Stat(reaperPIDPath(mg.Store, mg.Driver.Name())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("PID file left: %v", err)
	}
	unlock, ok, err := mg.Store.tryReaperLock(mg.Driver.Name())
	if !ok || err != nil {
		t.Errorf("reaper lock still held after exit: %v", err)
	} else {
		unlock()
	}
}

func TestTTLLeft(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		exp  time.Time
		want time.Duration
	}{
		{time.Time{}, 0},
		{now.Add(-time.Second), 0},
		{now.Add(90*time.Second + 400*time.Millisecond), 90 * time.Second},
	}
	for _, c := range cases {
		if got := TTLLeft(c.exp, now); got != c.want {
			t.Errorf("TTLLeft(%v) = %v, want %v", c.exp, got, c.want)
		}
	}
}

func TestJoinLineKeepsOneLine(t *testing.T) {
	a, b := errors.New("a"), errors.New("b")
	err := joinLine(nil, a, nil, b)
	if err.Error() != "a; b" || !errors.Is(err, a) || !errors.Is(err, b) {
		t.Errorf("joinLine = %q, want \"a; b\" matching both", err)
	}
	if joinLine(nil, nil) != nil || joinLine(a) != a {
		t.Errorf("joinLine of nils or one error is not that")
	}
}

// A fork's TTL is on each child's record from its reservation on, so a
// child of a fork whose process dies still goes; a bad TTL is refused
// before the source is frozen.
func TestForkTTLIsRecordedAtReservation(t *testing.T) {
	mg, fd := newTestManager(t)
	d := &linkDriver{fakeDriver: fd}
	mg.Driver = d
	starts := countStarts(mg)
	bootFake(t, mg, "src")
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "src", Count: 1, TTL: -time.Second, Identity: okChain}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Fork with a negative TTL = %v, want ErrInvalid", err)
	}
	if fd.freezeSeen != 0 {
		t.Fatalf("a refused fork froze the source")
	}
	var seen time.Time
	step := okChain
	step.Edit = chainOf(customizeStep(func() {
		// Runs in the child before the fork returns.
		if m, err := mg.Store.LoadMachine("src-1"); err == nil {
			seen = m.Expires
		}
	}))
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "src", Count: 1, TTL: time.Hour, Identity: step}); err != nil {
		t.Fatal(err)
	}
	if seen.IsZero() {
		t.Errorf("the child's record had no deadline while the fork ran")
	}
	m, err := mg.Store.LoadMachine("src-1")
	if err != nil || !m.Expires.Equal(seen) {
		t.Errorf("child's deadline after the fork = %v, %v; want %v", m.Expires, err, seen)
	}
	if starts.Load() != 1 {
		t.Errorf("reaper started %d times, want 1", starts.Load())
	}
}
