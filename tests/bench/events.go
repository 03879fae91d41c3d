package bench

import (
	"context"
	"io"
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
		ChildReady: func(i vmfork.ChildReadyInfo) {
			e.mu.Lock()
			e.ready = append(e.ready, i.At)
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
