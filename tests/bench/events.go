package bench

import (
	"cmp"
	"context"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
)

// forkEvents notes the moments a fork's trace (vmfork.ForkTrace) reports:
// each child's start and the phases its driver reports (the phases of a
// fork child: QMP up, load done, cont), and each child's ready (the
// ready-over-time curve of a burst: ForkResult has per-child durations
// only, each from the child's own start, and children wait for a slot).
// The harness learns no phase from vmfork's log text.
type forkEvents struct {
	mu      sync.Mutex
	started map[string]time.Time
	phases  map[string]map[vmfork.ChildPhase]time.Time
	ready   []time.Time
	notify  func() // called on each ready child
	// running, readyAt and failed are each child's moments by name: the
	// burst's per-child timeline and its CPU sampler's states.
	running map[string]runningAt
	readyAt map[string]time.Time
	failed  map[string]time.Time
	// readyCPU is each child's QEMU CPU seconds when it became READY
	// (read in the hook: one small /proc file).
	readyCPU map[string]float64
}

// runningAt is when a child's vCPUs began to run, and its QEMU.
type runningAt struct {
	at  time.Time
	pid int
}

// attach returns ctx carrying the trace that feeds e.
func (e *forkEvents) attach(ctx context.Context) context.Context {
	return vmfork.WithForkTrace(ctx, &vmfork.ForkTrace{
		ChildStarted: func(i vmfork.ChildStartInfo) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.started[i.Child] = i.At
		},
		ChildPhase: func(i vmfork.ChildPhaseInfo) {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.phases[i.Child] == nil {
				e.phases[i.Child] = map[vmfork.ChildPhase]time.Time{}
			}
			e.phases[i.Child][i.Phase] = i.At
		},
		ChildRunning: func(i vmfork.ChildRunningInfo) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.running[i.Child] = runningAt{i.At, i.PID}
		},
		ChildFailed: func(i vmfork.ChildFailedInfo) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.failed[i.Child] = i.At
		},
		ChildReady: func(i vmfork.ChildReadyInfo) {
			cpu, cpuOK := chainCPU(i.PID)
			e.mu.Lock()
			e.ready = append(e.ready, i.At)
			e.readyAt[i.Name] = i.At
			if cpuOK {
				e.readyCPU[i.Name] = cpu
			}
			n := e.notify
			e.mu.Unlock()
			if n != nil {
				n()
			}
		},
	})
}

// reset forgets earlier events and calls notify on each new ready child.
func (e *forkEvents) reset(notify func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.started, e.phases, e.ready, e.notify = map[string]time.Time{}, map[string]map[vmfork.ChildPhase]time.Time{}, nil, notify
	e.running, e.readyAt, e.failed, e.readyCPU = map[string]runningAt{}, map[string]time.Time{}, map[string]time.Time{}, map[string]float64{}
}

// childState is where a child stands at a moment: not started, in its
// start or identity chain, ready, or failed.
type childState int

const (
	stateNone childState = iota
	stateChain
	stateReady
	stateFailed
)

// state returns child's state at t.
func (e *forkEvents) state(child string, t time.Time) childState {
	e.mu.Lock()
	defer e.mu.Unlock()
	if at, ok := e.failed[child]; ok && !at.After(t) {
		return stateFailed
	}
	if at, ok := e.readyAt[child]; ok && !at.After(t) {
		return stateReady
	}
	if at, ok := e.started[child]; ok && !at.After(t) {
		return stateChain
	}
	return stateNone
}

// readySince returns the moments children were ready, in ms since t0.
func (e *forkEvents) readySince(t0 time.Time) []float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []float64
	for _, at := range e.ready {
		out = append(out, ms(at.Sub(t0)))
	}
	return out
}

// childStart returns the moment child's creation began.
func (e *forkEvents) childStart(child string) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	at, ok := e.started[child]
	return at, ok
}

// phase returns the moment child's driver reported phase.
func (e *forkEvents) phase(child string, phase vmfork.ChildPhase) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	at, ok := e.phases[child][phase]
	return at, ok
}

// writerHook passes vmfork's log lines at the user's level to a writer; the
// logger itself writes nowhere.
type writerHook struct {
	w     io.Writer
	level logrus.Level
	f     logrus.Formatter
}

func (h writerHook) Levels() []logrus.Level { return logrus.AllLevels[:h.level+1] }

func (h writerHook) Fire(en *logrus.Entry) error {
	b, err := h.f.Format(en)
	if err != nil {
		return err
	}
	_, err = h.w.Write(b)
	return err
}

// BurstChild is one child's timeline in a burst, each moment in ms since
// the fork call (0 when it never got there).
type BurstChild struct {
	Name      string  `json:"name"`
	StartedMS float64 `json:"started_ms"` // it had its start slot
	RunningMS float64 `json:"running_ms"` // its vCPUs ran
	ReadyMS   float64 `json:"ready_ms"`   // READY: identity chain done
	FailedMS  float64 `json:"failed_ms,omitempty"`
	// ChainCPUS is what its QEMU had used when it became READY, in CPU
	// seconds.
	ChainCPUS float64 `json:"chain_cpu_s,omitempty"`
}

// timeline returns every started child's moments since t0, in start order.
func (e *forkEvents) timeline(t0 time.Time) []BurstChild {
	e.mu.Lock()
	defer e.mu.Unlock()
	since := func(at time.Time, ok bool) float64 {
		if !ok {
			return 0
		}
		return ms(at.Sub(t0))
	}
	var out []BurstChild
	for name, at := range e.started {
		c := BurstChild{Name: name, StartedMS: ms(at.Sub(t0)), ChainCPUS: e.readyCPU[name]}
		r, ok := e.running[name]
		c.RunningMS = since(r.at, ok)
		ra, ok := e.readyAt[name]
		c.ReadyMS = since(ra, ok)
		fa, ok := e.failed[name]
		c.FailedMS = since(fa, ok)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b BurstChild) int { return cmp.Compare(a.StartedMS, b.StartedMS) })
	return out
}
