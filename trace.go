package vmfork

import (
	"context"
	"time"

	"github.com/vmfork/vmfork/customize"
)

// ForkTrace is a set of hooks into a fork, the way net/http/httptrace hooks
// into a request: a program embedding the Manager, the CLI's progress lines
// and the benchmarks learn each phase from it, never from log text. Attach
// one with WithForkTrace; Fork, Keep and Explore (through its fork) call it.
//
// Any field may be nil. Hooks are called synchronously, from the goroutine
// doing the work: the children's hooks from each child's own goroutine, so
// hooks of different children can run at once and must be safe for that. A
// hook must return quickly (note the moment, print a line, send on a
// buffered channel): a child waits for its hooks, and a slow hook makes its
// figures slower. No hook is called while the source is paused.
type ForkTrace struct {
	// SourceFrozen: the fork point is taken and a running source runs
	// again (Fork, Keep, Hibernate). Not called for a fork of a kept
	// template: nothing is frozen.
	SourceFrozen func(FrozenInfo)
	// ChildStarted: a child's creation begins (it has its slot of
	// ForkRequest.Parallel); its RunningMS and ReadyMS count from here.
	ChildStarted func(ChildStartInfo)
	// ChildPhase: a driver reports a moment inside the start of a child
	// (TraceChildPhase); drivers that report none never call it.
	ChildPhase func(ChildPhaseInfo)
	// ChildRunning: the child's vCPUs run; its identity chain comes next.
	ChildRunning func(ChildRunningInfo)
	// StepDone: one step of a child's identity chain has ended, in any
	// status (customize.Status).
	StepDone func(StepInfo)
	// ChildReady: the child has its identity and is on the network. Its
	// ChildResult is the one the ForkResult lists.
	ChildReady func(ChildReadyInfo)
	// ChildFailed: the child did not come up; the ForkResult lists it
	// under Failed. Called once per failed child, after its process is
	// gone (or kept, link down, with IdentityOptions.KeepOnFailure).
	ChildFailed func(ChildFailedInfo)
}

// FrozenInfo is a source's freeze: Template is the fork point, Kept its
// name when Keep made it, Pause how long the source was paused (0 for a
// stopped source). RAMMode, PrecopiedBytes and RAMCopiedBytes are the
// driver's FreezeResult: how the RAM was frozen, what was copied before
// and during the pause.
type FrozenInfo struct {
	Source         string
	Template       string
	Kept           string
	Pause          time.Duration
	RAMMode        string
	PrecopiedBytes int64
	RAMCopiedBytes int64
	At             time.Time
}

// ChildStartInfo is a child whose creation begins: the Index-th (from 1) of
// its fork; Pooled when a warm-pool process becomes it.
type ChildStartInfo struct {
	Child    string
	Template string
	Index    int
	Pooled   bool
	At       time.Time
}

// ChildPhase names a moment inside a child's start that a driver reports.
type ChildPhase string

// The phases qemudrv reports, in this order. A pool member becomes a child
// with its QEMU already up: only PhaseStateLoaded is reported for it.
const (
	// PhaseQMPReady: the child's QEMU answers QMP (qmp_capabilities), so
	// it has finished starting.
	PhaseQMPReady ChildPhase = "qmp_ready"
	// PhaseStateLoaded: the device state is loaded; the child's link is
	// set down and its vCPUs are let run next.
	PhaseStateLoaded ChildPhase = "state_loaded"
)

// ChildPhaseInfo is one ChildPhase of one child.
type ChildPhaseInfo struct {
	Child string
	Phase ChildPhase
	At    time.Time
}

// ChildRunningInfo is a child whose vCPUs run, Running after its start.
type ChildRunningInfo struct {
	Child   string
	PID     int
	Running time.Duration
	At      time.Time
}

// StepInfo is one identity step of one child.
type StepInfo struct {
	Child  string
	Result customize.StepResult
	At     time.Time
}

// ChildReadyInfo is a child that came up.
type ChildReadyInfo struct {
	ChildResult
	At time.Time
}

// ChildFailedInfo is a child that did not come up; Identity is what its
// chain did, when it got that far.
type ChildFailedInfo struct {
	Child    string
	Err      error
	Identity *IdentityResult
	At       time.Time
}

type forkTraceKey struct{}

// WithForkTrace returns a context that carries trace. When ctx carries a
// trace already, both are called, trace's hooks first (as
// httptrace.WithClientTrace composes).
func WithForkTrace(ctx context.Context, trace *ForkTrace) context.Context {
	if trace == nil {
		return ctx
	}
	if old := ContextForkTrace(ctx); old != nil {
		trace = composeTraces(trace, old)
	}
	return context.WithValue(ctx, forkTraceKey{}, trace)
}

// ContextForkTrace returns the trace ctx carries, or nil.
func ContextForkTrace(ctx context.Context) *ForkTrace {
	t, _ := ctx.Value(forkTraceKey{}).(*ForkTrace)
	return t
}

// TraceChildPhase reports phase of child to the trace ctx carries, if any.
// Drivers call it from StartChild and Pooler.Complete.
func TraceChildPhase(ctx context.Context, child string, phase ChildPhase) {
	if t := ContextForkTrace(ctx); t != nil && t.ChildPhase != nil {
		t.ChildPhase(ChildPhaseInfo{Child: child, Phase: phase, At: time.Now()})
	}
}

func composeTraces(a, b *ForkTrace) *ForkTrace {
	return &ForkTrace{
		SourceFrozen: both(a.SourceFrozen, b.SourceFrozen),
		ChildStarted: both(a.ChildStarted, b.ChildStarted),
		ChildPhase:   both(a.ChildPhase, b.ChildPhase),
		ChildRunning: both(a.ChildRunning, b.ChildRunning),
		StepDone:     both(a.StepDone, b.StepDone),
		ChildReady:   both(a.ChildReady, b.ChildReady),
		ChildFailed:  both(a.ChildFailed, b.ChildFailed),
	}
}

func both[T any](a, b func(T)) func(T) {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return func(v T) { a(v); b(v) }
}

// tracer calls the hooks of the trace a context carries; its zero value,
// and that of a trace with nil fields, calls nothing.
type tracer struct{ t *ForkTrace }

func traceOf(ctx context.Context) tracer { return tracer{ContextForkTrace(ctx)} }

func (tr tracer) sourceFrozen(i FrozenInfo) {
	if tr.t != nil && tr.t.SourceFrozen != nil {
		tr.t.SourceFrozen(i)
	}
}

func (tr tracer) childStarted(i ChildStartInfo) {
	if tr.t != nil && tr.t.ChildStarted != nil {
		tr.t.ChildStarted(i)
	}
}

func (tr tracer) childRunning(i ChildRunningInfo) {
	if tr.t != nil && tr.t.ChildRunning != nil {
		tr.t.ChildRunning(i)
	}
}

// stepDone returns the customize.Env hook for child's steps, nil if the
// trace has none.
func (tr tracer) stepDone(child string) func(customize.StepResult) {
	if tr.t == nil || tr.t.StepDone == nil {
		return nil
	}
	f := tr.t.StepDone
	return func(r customize.StepResult) { f(StepInfo{Child: child, Result: r, At: time.Now()}) }
}

func (tr tracer) childReady(i ChildReadyInfo) {
	if tr.t != nil && tr.t.ChildReady != nil {
		tr.t.ChildReady(i)
	}
}

func (tr tracer) childFailed(i ChildFailedInfo) {
	if tr.t != nil && tr.t.ChildFailed != nil {
		tr.t.ChildFailed(i)
	}
}
