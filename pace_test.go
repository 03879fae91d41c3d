package vmfork

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmfork/vmfork/customize"
)

// TestPacer: at most as many children start at once as CPU pressure says
// while the chains tell nothing.
func TestPacer(t *testing.T) {
	h := &fakeHost{cpu: 95, cpuOK: true}
	p := newPacer(4, h, nil)
	var mu sync.Mutex
	running, most := 0, 0
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.acquire(t.Context()); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			running--
			mu.Unlock()
			p.release()
		}()
	}
	wg.Wait()
	if most != 1 {
		t.Errorf("at 95%% CPU pressure %d started at once, want 1", most)
	}
}

// fakeClock is a pacer's clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestPacerProgress: under another tenant's CPU pressure, children whose
// steps use little of their timeouts start more at once, a second at a
// time, up to --parallel; a slow step halves the number, a middling one
// holds it, silence drifts back to what pressure says; and slow chains
// slow the start down on an idle host too.
func TestPacerProgress(t *testing.T) {
	h := &fakeHost{cpu: 95, cpuOK: true}
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	p := newPacer(4, h, nil)
	p.now = clk.now
	const to = 10 * time.Second
	judge := func(what string, want int) {
		t.Helper()
		p.mu.Lock()
		got := p.judge()
		p.mu.Unlock()
		if got != want {
			t.Errorf("%s: %d at once, want %d", what, got, want)
		}
	}
	second := func(shares ...float64) {
		clk.add(pacePoll)
		for _, s := range shares {
			p.stepEnded(time.Duration(s*float64(to)), to)
		}
	}
	judge("first slot at 95% pressure", 1)
	second(0.1, 0.05)
	judge("good steps", 2)
	p.stepEnded(9*to, to) // within the same second: not judged yet
	p.mu.Lock()
	p.steps, p.worst = 0, 0
	p.mu.Unlock()
	judge("within a second", 2)
	second(0.2)
	judge("good steps", 3)
	second(0.25, 0.1)
	judge("good steps", 4)
	second(0.1)
	judge("good steps at --parallel", 4)
	second(0.1, 0.3)
	judge("a middling step", 4)
	second(0.1, 0.6)
	judge("a slow step", 2)
	second(1.5) // stretched
	judge("a stretched step", 1)
	second(0.1)
	judge("good steps again", 2)
	second()
	judge("no step ended, pressure says 1", 1)
	second()
	judge("still silent", 1)
	p.stepEnded(time.Hour, 0) // no timeout: not judged by
	second()
	judge("a step without a timeout", 1)

	// On an idle host the first slots are --parallel, and slow chains
	// still halve them; silence drifts back up.
	h.cpu = 10
	p = newPacer(4, h, nil)
	p.now = clk.now
	judge("idle host", 4)
	second(0.7)
	judge("idle host, slow step", 2)
	second()
	judge("idle host, silence", 3)
}

// TestPacerNeverExceedsParallel: however well the chains go and however
// often the pacer judges, no more than --parallel children run at once, and
// good progress takes a burst past what pressure alone allows.
func TestPacerNeverExceedsParallel(t *testing.T) {
	h := &fakeHost{cpu: 95, cpuOK: true}
	p := newPacer(3, h, nil)
	var clock atomic.Int64
	p.now = func() time.Time { return time.Unix(0, clock.Add(int64(pacePoll))) } // each look is a second later
	var running, most atomic.Int32
	var wg sync.WaitGroup
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.acquire(t.Context()); err != nil {
				t.Error(err)
				return
			}
			n := running.Add(1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			p.stepEnded(100*time.Millisecond, 10*time.Second)
			time.Sleep(10 * time.Millisecond)
			running.Add(-1)
			p.release()
		}()
	}
	wg.Wait()
	if m := most.Load(); m > 3 || m < 2 {
		t.Errorf("at most %d at once, want 2 or 3 of --parallel 3", m)
	}
}

// TestGuestRuns: a QEMU that gets CPU runs; one that gets none is stuck,
// one that is gone does not run.
func TestGuestRuns(t *testing.T) {
	mg, _ := newTestManager(t)
	h := thisHost(mg.Store)
	mg.Host = h
	runs := mg.guestRuns(&Machine{Name: "c", PID: 42})
	if !runs() {
		t.Error("a QEMU that gets CPU: does not run")
	}
	h.mu.Lock()
	h.stuck = true
	h.mu.Unlock()
	if runs() {
		t.Error("a QEMU that gets no CPU: runs")
	}
	if mg.guestRuns(&Machine{Name: "gone"})() {
		t.Error("no process: runs")
	}
}

// TestPaceSteps: the pacer hears each step that ran with its own timeout;
// skipped and unrun steps tell nothing, and the trace hears every step.
func TestPaceSteps(t *testing.T) {
	chain := customize.NewChain(customize.AgentStep(), customize.NetworkStep(customize.NetworkSpec{}))
	type heard struct{ took, timeout time.Duration }
	var got []heard
	var traced []string
	done := paceSteps(chain, func(took, timeout time.Duration) { got = append(got, heard{took, timeout}) },
		func(sr customize.StepResult) { traced = append(traced, sr.Name) })
	done(customize.StepResult{Name: customize.StepAgent, Status: customize.StatusOK, DurationMS: 2500})
	done(customize.StepResult{Name: customize.StepNetwork, Status: customize.StatusFailed, DurationMS: 31000})
	done(customize.StepResult{Name: customize.StepNetwork, Status: customize.StatusSkipped})
	done(customize.StepResult{Name: customize.StepHostname, Status: customize.StatusNotRun})
	want := []heard{{2500 * time.Millisecond, customize.DefaultTimeout}, {31 * time.Second, 30 * time.Second}}
	if !slices.Equal(got, want) || len(traced) != 4 {
		t.Errorf("heard %v, traced %v; want %v and 4 steps traced", got, traced, want)
	}
	if paceSteps(chain, nil, nil) != nil {
		t.Error("no pacer, no trace: a hook")
	}
}
