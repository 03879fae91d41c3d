package vmfork

import (
	"context"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// A fork's children start at most --parallel at once, fewer while the host's
// CPUs are contended: an idle child still costs a few percent of a core under
// TCG, so late in a burst every new child's identity chain crawls behind
// the earlier ones, and starting more at once only makes each slower (issue
// 29). CPU pressure never refuses a fork (admission.go); it slows its
// start down.
//
// Pressure alone cannot tell whose work contends: on a host shared with
// other tenants it stays high whatever the burst does, and a burst paced on
// it alone starts its children one at a time although each of them makes
// good progress (docs/BENCHMARKS.md, "Burst"). So the pacer also watches
// the burst's own chains, by how much of each identity step's timeout the
// step used: that is what decides whether a child is lost. Each second in
// which a child is waiting for a slot:
//
//   - every step that ended used at most a quarter of its timeout (the
//     chains keep 4x their time in hand): one child more at once, up to
//     --parallel;
//   - a step used more than half of its timeout (or was stretched): half
//     as many at once, down to one;
//   - in between: as many as now;
//   - no step ended (nothing to judge by yet, or every chain is stuck in a
//     step): one step toward what CPU pressure says (pacedParallel).
//
// The first slots follow CPU pressure. Never more than --parallel.

// Pressure thresholds, in percent of /proc/pressure/cpu's "some avg10".
const (
	pressureHalf = 60 // from here, half the parallel
	pressureOne  = 90 // from here, one child at a time
)

// Progress thresholds: the largest share of its timeout that a step which
// ended in the last second used.
const (
	progressGood = 0.25 // up to here, one child more at once
	progressSlow = 0.5  // above here, half as many
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

// pacer hands out start slots: at most limit at once, limit judged again
// (at most every pacePoll) while a start waits, by the rule above.
type pacer struct {
	parallel int
	pressure func() int       // pacedParallel at the host's CPU pressure now
	now      func() time.Time // the clock; tests set it
	log      logrus.FieldLogger

	mu      sync.Mutex
	running int
	limit   int // 0 until first judged
	last    time.Time
	// The steps that ended since the last judgement: how many, and the
	// largest share of its timeout one used.
	steps int
	worst float64
}

const pacePoll = time.Second

func newPacer(parallel int, h HostProbe, log logrus.FieldLogger) *pacer {
	return &pacer{
		parallel: max(1, parallel),
		pressure: func() int {
			pct, ok := h.CPUPressure()
			return pacedParallel(parallel, pct, ok)
		},
		now: time.Now,
		log: log,
	}
}

// stepEnded tells the pacer that a step of one of its children's chains
// ended after took, of a timeout of timeout.
func (p *pacer) stepEnded(took, timeout time.Duration) {
	if timeout <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.steps++
	p.worst = max(p.worst, float64(took)/float64(timeout))
}

// judge returns how many children may start at once now, judged again when
// pacePoll has passed since the last time. p.mu is held.
func (p *pacer) judge() int {
	now := p.now()
	if p.limit != 0 && now.Sub(p.last) < pacePoll {
		return p.limit
	}
	old := p.limit
	switch {
	case p.limit == 0:
		p.limit = p.pressure()
	case p.steps == 0:
		if pl := p.pressure(); pl > p.limit {
			p.limit++
		} else if pl < p.limit {
			p.limit--
		}
	case p.worst <= progressGood:
		p.limit++
	case p.worst > progressSlow:
		p.limit /= 2
	}
	p.limit = min(p.parallel, max(1, p.limit))
	if old != 0 && p.limit != old && p.log != nil {
		p.log.WithFields(logrus.Fields{"steps": p.steps, "worst_step_share": p.worst, "at_once": p.limit}).Debug("children's start paced")
	}
	p.last, p.steps, p.worst = now, 0, 0
	return p.limit
}

// acquire waits for a slot until ctx ends.
func (p *pacer) acquire(ctx context.Context) error {
	for {
		if p.tryAcquire() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *pacer) tryAcquire() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running < p.judge() {
		p.running++
		return true
	}
	return false
}

func (p *pacer) release() {
	p.mu.Lock()
	p.running--
	p.mu.Unlock()
}

// guestRuns says whether c's QEMU has had CPU time since the last question
// (the first question: since guestRuns was called); false once it is gone.
// A QEMU that runs is no proof that the guest does what it should, but one
// that got no CPU at all, or is gone, is stuck or dead.
func (mg *Manager) guestRuns(c *Machine) func() bool {
	h := mg.host()
	last, _ := h.CPUTicks(c.PID)
	return func() bool {
		now, ok := h.CPUTicks(c.PID)
		ran := ok && now > last
		last = now
		return ran
	}
}

// slowGuest says, for a step whose time ran out in child c, whether c is
// slow rather than dead: its QEMU got CPU time since the last question (the
// guest runs), on a host whose CPUs are contended (it runs slowly). A guest
// on an idle host, or one whose QEMU no longer runs, is not slow.
func (mg *Manager) slowGuest(c *Machine) func() bool {
	h := mg.host()
	runs := mg.guestRuns(c)
	return func() bool {
		ran := runs()
		pct, pok := h.CPUPressure()
		slow := ran && pok && pct >= pressureHalf
		if slow {
			mg.Log.WithField("machine", c.Name).WithField("cpu_pressure_pct", pct).Info("the guest is slow on a busy host: its step gets more time")
		}
		return slow
	}
}
