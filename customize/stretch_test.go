package customize

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestStretchSlowGuest: a step whose guest is slow, not dead, gets its
// timeout again while Env.Slow says so, up to MaxStretch times; without
// Slow, or once it says no, the step times out as before.
func TestStretchSlowGuest(t *testing.T) {
	late := func(d time.Duration) Step {
		return Step{Name: "late", Timeout: 50 * time.Millisecond, Fn: func(ctx context.Context, env *Env) error {
			select {
			case <-time.After(d):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}}
	}
	// Slow: a step that needs 3 periods finishes.
	res, err := Run(t.Context(), NewChain(late(130*time.Millisecond)), &Env{Slow: func() bool { return true }})
	if err != nil || res.Steps[0].Stretched < 2 {
		t.Fatalf("slow guest: %v, %+v; want done, stretched twice or more", err, res.Steps)
	}
	// Not slow: the first period is all.
	_, err = Run(t.Context(), NewChain(late(130*time.Millisecond)), &Env{Slow: func() bool { return false }})
	if err == nil || !strings.Contains(err.Error(), `step "late": timed out after 50ms: context deadline exceeded`) {
		t.Errorf("dead guest: %v", err)
	}
	// Slow for ever: at most MaxStretch more periods.
	var asked atomic.Int32
	start := time.Now()
	_, err = Run(t.Context(), NewChain(late(time.Hour)), &Env{Slow: func() bool { asked.Add(1); return true }})
	if err == nil || !strings.Contains(err.Error(), `timed out after 300ms`) || asked.Load() != MaxStretch {
		t.Errorf("slow for ever: %v after %v, asked %d times; want a timeout after 300ms, asked %d", err, time.Since(start), asked.Load(), MaxStretch)
	}
	// A timeout given (a spec, --step-timeout) is kept to.
	_, err = Run(t.Context(), NewChain(late(130*time.Millisecond)).WithTimeout("late", 50*time.Millisecond), &Env{Slow: func() bool { return true }})
	if err == nil || !strings.Contains(err.Error(), `timed out after 50ms`) {
		t.Errorf("a firm timeout: %v", err)
	}
	// The caller's cancel is not a timeout.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	_, err = Run(ctx, NewChain(late(time.Hour)), &Env{Slow: func() bool { return true }})
	if err == nil || strings.Contains(err.Error(), "timed out after") {
		t.Errorf("cancelled by the caller: %v", err)
	}
}
