package vmfork

import (
	"context"
	"sync"
	"time"
)

// A fork's children start at most --parallel at once, fewer while the host's
// CPUs are contended: an idle child still costs a few percent of a core under
// TCG, so late in a burst every new child's identity chain crawls behind
// the earlier ones, and starting more at once only makes each slower (issue
// 29). CPU pressure never refuses a fork (admission.go); it slows its
// start down.

// Pressure thresholds, in percent of /proc/pressure/cpu's "some avg10".
const (
	pressureHalf = 60 // from here, half the parallel
	pressureOne  = 90 // from here, one child at a time
)

// pacedParallel is how many children start at once at CPU pressure pct,
// of at most parallel.
func pacedParallel(parallel int, pct float64, ok bool) int {
	switch {
	case !ok || pct < pressureHalf:
		return parallel
	case pct < pressureOne:
		return max(1, parallel/2)
	}
	return 1
}

func paceWords(pct float64) string {
	switch {
	case pct >= pressureOne:
		return ": children start one at a time"
	case pct >= pressureHalf:
		return ": children start at half the parallel"
	}
	return ""
}

// pacer hands out start slots: at most limit() at once, limit read again
// (at most every pacePoll) while a start waits.
type pacer struct {
	mu      sync.Mutex
	running int
	limit   func() int
	last    time.Time
	cached  int
}

const pacePoll = time.Second

func newPacer(parallel int, h HostProbe) *pacer {
	return &pacer{limit: func() int {
		pct, ok := h.CPUPressure()
		return pacedParallel(parallel, pct, ok)
	}}
}

// acquire waits for a slot until ctx ends.
func (p *pacer) acquire(ctx context.Context) error {
	for {
		p.mu.Lock()
		if time.Since(p.last) >= pacePoll {
			p.cached, p.last = p.limit(), time.Now()
		}
		if p.running < p.cached {
			p.running++
			p.mu.Unlock()
			return nil
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *pacer) release() {
	p.mu.Lock()
	p.running--
	p.mu.Unlock()
}

// slowGuest says, for a step whose time ran out in child c, whether c is
// slow rather than dead: its QEMU got CPU time since the last question (the
// guest runs), on a host whose CPUs are contended (it runs slowly). A guest
// on an idle host, or one whose QEMU no longer runs, is not slow.
func (mg *Manager) slowGuest(c *Machine) func() bool {
	h := mg.host()
	last, _ := h.CPUTicks(c.PID)
	return func() bool {
		now, ok := h.CPUTicks(c.PID)
		ran := ok && now > last
		last = now
		pct, pok := h.CPUPressure()
		slow := ran && pok && pct >= pressureHalf
		if slow {
			mg.Log.WithField("machine", c.Name).WithField("cpu_pressure_pct", pct).Info("the guest is slow on a busy host: its step gets more time")
		}
		return slow
	}
}
