package vmfork

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmfork/vmfork/customize"
)

// phaseDriver reports qemudrv's phases from StartChild, as a driver does.
type phaseDriver struct{ *linkDriver }

func (d *phaseDriver) StartChild(ctx context.Context, c *Machine, t *Template) error {
	TraceChildPhase(ctx, c.Name, PhaseQMPReady)
	if err := d.linkDriver.StartChild(ctx, c, t); err != nil {
		return err
	}
	c.PID = 2000 + len(c.Name) // the fake's own StartChild sets none
	TraceChildPhase(ctx, c.Name, PhaseStateLoaded)
	return nil
}

// Freeze reports a RAM mode and copies, as qemudrv's does.
func (d *phaseDriver) Freeze(ctx context.Context, src *Machine, t *Template, opts FreezeOptions) (FreezeResult, error) {
	fr, err := d.linkDriver.Freeze(ctx, src, t, opts)
	fr.Pause, fr.RAMMode, fr.PrecopiedBytes, fr.RAMCopiedBytes = 3*time.Millisecond, "diff", 5, 7
	return fr, err
}

// traceLog records each hook as a line, per machine ("" for the source's),
// and keeps what the hooks were given.
type traceLog struct {
	mu     sync.Mutex
	lines  map[string][]string
	order  []string // every line, in the order the hooks ran
	ready  []ChildReadyInfo
	failed []ChildFailedInfo
	frozen []FrozenInfo
}

func (l *traceLog) add(machine, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := fmt.Sprintf(format, args...)
	l.lines[machine] = append(l.lines[machine], s)
	l.order = append(l.order, machine+": "+s)
}

func (l *traceLog) trace() *ForkTrace {
	return &ForkTrace{
		SourceFrozen: func(i FrozenInfo) {
			l.add("", "frozen %s into %s kept %q", i.Source, i.Template, i.Kept)
			l.mu.Lock()
			l.frozen = append(l.frozen, i)
			l.mu.Unlock()
		},
		ChildStarted: func(i ChildStartInfo) { l.add(i.Child, "started %d of %s", i.Index, i.Template) },
		ChildPhase:   func(i ChildPhaseInfo) { l.add(i.Child, "phase %s", i.Phase) },
		ChildRunning: func(i ChildRunningInfo) { l.add(i.Child, "running pid=%t", i.PID != 0) },
		StepDone:     func(i StepInfo) { l.add(i.Child, "step %s %s", i.Result.Name, i.Result.Status) },
		ChildReady: func(i ChildReadyInfo) {
			l.add(i.Name, "ready")
			l.mu.Lock()
			l.ready = append(l.ready, i)
			l.mu.Unlock()
		},
		ChildFailed: func(i ChildFailedInfo) {
			l.add(i.Child, "failed")
			l.mu.Lock()
			l.failed = append(l.failed, i)
			l.mu.Unlock()
		},
	}
}

func TestForkTraceFiresInOrder(t *testing.T) {
	mg, d := newIdentityManager(t)
	bootFake(t, mg, "src")
	d.startFail["src-2"] = true
	steps := IdentityOptions{Edit: chainOf(
		customize.Step{Name: "t.a", Fn: func(context.Context, *customize.Env) error { return nil }},
		customize.SkipStep("t.b", "not here"),
	)}
	l := &traceLog{lines: map[string][]string{}}
	res, err := mg.Fork(WithForkTrace(t.Context(), l.trace()), ForkRequest{Source: "src", Count: 2, Identity: steps})
	if !errors.Is(err, ErrPartial) || res == nil {
		t.Fatalf("Fork = %+v, %v; want one child and one failure", res, err)
	}
	want := map[string]string{
		"":      fmt.Sprintf(`frozen src into %s kept ""`, res.Template),
		"src-1": fmt.Sprintf("started 1 of %s|phase qmp_ready|phase state_loaded|running pid=true|step t.a ok|step t.b skipped|ready", res.Template),
		"src-2": fmt.Sprintf("started 2 of %s|phase qmp_ready|failed", res.Template),
	}
	for m, w := range want {
		if got := strings.Join(l.lines[m], "|"); got != w {
			t.Errorf("hooks of %q: got %s, want %s", m, got, w)
		}
	}
	if len(l.order) == 0 || !strings.HasPrefix(l.order[0], ": frozen") {
		t.Errorf("first hook: got %v, want SourceFrozen before any child's", l.order)
	}
	if len(l.ready) != 1 || len(res.Children) != 1 || l.ready[0].ChildResult.Name != res.Children[0].Name ||
		l.ready[0].RunningMS != res.Children[0].RunningMS || l.ready[0].ReadyMS != res.Children[0].ReadyMS ||
		l.ready[0].Identity != res.Children[0].Identity || l.ready[0].At.IsZero() {
		t.Errorf("ChildReady got %+v, want the result's child %+v with its moment", l.ready, res.Children)
	}
	if len(l.failed) != 1 || !strings.Contains(l.failed[0].Err.Error(), "injected start failure") ||
		len(res.Failed) != 1 || res.Failed[0].Error != l.failed[0].Err.Error() {
		t.Errorf("ChildFailed got %+v, want the result's failure %+v", l.failed, res.Failed)
	}
	if len(l.frozen) != 1 || l.frozen[0].Pause != 3*time.Millisecond || res.PauseMS != 3 || l.frozen[0].At.IsZero() ||
		l.frozen[0].RAMMode != "diff" || l.frozen[0].PrecopiedBytes != 5 || l.frozen[0].RAMCopiedBytes != 7 {
		t.Errorf("SourceFrozen got %+v, want the driver's freeze (3 ms, diff, 5 and 7 bytes), the fork's pause %v ms", l.frozen, res.PauseMS)
	}
}

// A child whose identity chain fails fires ChildFailed with what its chain
// did, after StepDone of the failed step; ChildReady never.
func TestForkTraceIdentityFailure(t *testing.T) {
	mg, _ := newIdentityManager(t)
	bootFake(t, mg, "src")
	fail := IdentityOptions{Edit: chainOf(customize.Step{Name: "t.fail", Fn: func(context.Context, *customize.Env) error {
		return errors.New("injected")
	}})}
	l := &traceLog{lines: map[string][]string{}}
	res, err := mg.Fork(WithForkTrace(t.Context(), l.trace()), ForkRequest{Source: "src", Count: 1, Identity: fail})
	if err == nil || res == nil || len(res.Failed) != 1 {
		t.Fatalf("Fork = %+v, %v; want its child failed", res, err)
	}
	got := l.lines["src-1"]
	if !slices.Equal(got[3:], []string{"running pid=true", "step t.fail failed", "failed"}) {
		t.Errorf("hooks of src-1: got %v, want started, running, the failed step, failed", got)
	}
	if len(l.failed) != 1 || l.failed[0].Identity == nil || len(l.failed[0].Identity.Steps) != 1 {
		t.Errorf("ChildFailed got %+v, want the chain's result with its step", l.failed)
	}
}

// Traces compose: both are called, the inner one first; nil fields and a
// nil trace are skipped.
func TestForkTraceComposes(t *testing.T) {
	mg, _ := newIdentityManager(t)
	bootFake(t, mg, "src")
	var calls []string
	var mu sync.Mutex
	note := func(s string) { mu.Lock(); calls = append(calls, s); mu.Unlock() }
	ctx := WithForkTrace(t.Context(), &ForkTrace{ChildReady: func(ChildReadyInfo) { note("outer") }})
	ctx = WithForkTrace(ctx, nil)
	ctx = WithForkTrace(ctx, &ForkTrace{ChildReady: func(ChildReadyInfo) { note("inner") }, SourceFrozen: func(FrozenInfo) { note("frozen") }})
	if _, err := mg.Fork(ctx, ForkRequest{Source: "src", Count: 1, Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(calls, " "); got != "frozen inner outer" {
		t.Errorf("calls: got %s, want frozen inner outer", got)
	}
	if ContextForkTrace(t.Context()) != nil {
		t.Errorf("a context without a trace returned one")
	}
}

// Keep's freeze fires SourceFrozen with the kept name; a fork of the kept
// template freezes nothing and fires no SourceFrozen.
func TestKeepTraceSourceFrozen(t *testing.T) {
	mg, _ := newIdentityManager(t)
	bootFake(t, mg, "src")
	l := &traceLog{lines: map[string][]string{}}
	ctx := WithForkTrace(t.Context(), l.trace())
	tpl, err := mg.Keep(ctx, KeepRequest{Source: "src", Name: "gold"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Fork(ctx, ForkRequest{Source: "gold", Count: 1, Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`frozen src into %s kept "gold"`, tpl.ID)
	if got := strings.Join(l.lines[""], "|"); got != want {
		t.Errorf("source hooks: got %s, want %s", got, want)
	}
	if len(l.ready) != 1 {
		t.Errorf("ChildReady fired %d times, want once", len(l.ready))
	}
}

func newIdentityManager(t *testing.T) (*Manager, *phaseDriver) {
	t.Helper()
	d := &phaseDriver{&linkDriver{fakeDriver: newFakeDriver()}}
	return NewManager(newTestStore(t), d, nil), d
}
