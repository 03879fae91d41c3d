package customize

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestRetryLateAgent: an agent step whose time ran out while the guest's
// QEMU still ran (Env.Runs) is run once more, and a late agent's answer
// then passes; a guest that got no CPU, one that is gone, a firm timeout,
// and an agent that never answers fail as before, after at most one retry.
func TestRetryLateAgent(t *testing.T) {
	const period = 250 * time.Millisecond // wide margins: a loaded CI host delays timers tens of ms
	agentStep := func() Step { s := AgentStep(); s.Timeout = period; return s }
	// late returns an agent that answers d from now.
	late := func(d time.Duration) Agent { return &lateAgent{fakeAgent: newFakeAgent(), at: time.Now().Add(d)} }
	var asked atomic.Int32
	runs := func(v bool) func() bool { return func() bool { asked.Add(1); return v } }

	// Late, but its QEMU runs: retried once, and READY.
	asked.Store(0)
	res, err := Run(t.Context(), NewChain(agentStep()), &Env{Agent: late(period + period/2), Runs: runs(true)})
	if err != nil || res.Steps[0].Retried != 1 || res.Steps[0].Status != StatusOK {
		t.Fatalf("late agent, running QEMU: %v, %+v; want ok after one retry", err, res.Steps)
	}
	if asked.Load() != 2 {
		t.Errorf("asked Runs %d times, want 2 (at the start, at the timeout)", asked.Load())
	}
	// Its QEMU got no CPU: stuck, fails at the first timeout.
	res, err = Run(t.Context(), NewChain(agentStep()), &Env{Agent: late(period + period/2), Runs: runs(false)})
	if err == nil || !strings.Contains(err.Error(), `step "vmfork.agent": timed out after 250ms`) || res.Steps[0].Retried != 0 {
		t.Errorf("stuck QEMU: %v, %+v", err, res.Steps)
	}
	// Never answers: one retry, no more.
	asked.Store(0)
	res, err = Run(t.Context(), NewChain(agentStep()), &Env{Agent: late(time.Hour), Runs: runs(true)})
	if err == nil || !strings.Contains(err.Error(), `timed out after 500ms`) || res.Steps[0].Retried != 1 || asked.Load() != 2 {
		t.Errorf("dead agent, running QEMU: %v, %+v, asked %d; want a timeout after 500ms, one retry", err, res.Steps, asked.Load())
	}
	// Gone: no retry, at once.
	gone := newFakeAgent()
	gone.pingErr = ErrMachineGone
	start := time.Now()
	res, err = Run(t.Context(), NewChain(agentStep()), &Env{Agent: gone, Runs: runs(true)})
	if !errors.Is(err, ErrMachineGone) || res.Steps[0].Retried != 0 || time.Since(start) > period {
		t.Errorf("gone: %v, %+v after %v", err, res.Steps, time.Since(start))
	}
	// A timeout given is kept to.
	_, err = Run(t.Context(), NewChain(agentStep()).WithTimeout(StepAgent, period), &Env{Agent: late(period + period/2), Runs: runs(true)})
	if err == nil || !strings.Contains(err.Error(), "timed out after 250ms") {
		t.Errorf("firm timeout: %v", err)
	}
	// Only the agent's step: another step's timeout stands.
	other := Step{Name: "other", Timeout: period, Fn: func(ctx context.Context, _ *Env) error { <-ctx.Done(); return ctx.Err() }}
	res, err = Run(t.Context(), NewChain(other), &Env{Runs: runs(true)})
	if err == nil || res.Steps[0].Retried != 0 {
		t.Errorf("a step that is not retryable: %v, %+v", err, res.Steps)
	}
}

// lateAgent answers its first ping at at, as an agent does in a guest that
// gets little CPU.
type lateAgent struct {
	*fakeAgent
	at time.Time
}

func (l *lateAgent) Ping(ctx context.Context) error {
	select {
	case <-time.After(time.Until(l.at)):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
