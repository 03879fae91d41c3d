package customize

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// Agent is what the steps need of a guest agent. *qmp.Agent implements it.
type Agent interface {
	Ping(ctx context.Context) error
	Exec(ctx context.Context, req qmp.ExecRequest) (int, error)
	ExecStatus(ctx context.Context, pid int) (qmp.ExecStatus, error)
	GetTime(ctx context.Context) (time.Time, error)
	SetTime(ctx context.Context, t *time.Time) error
	WriteFile(ctx context.Context, path string, data []byte) error
	ReadFile(ctx context.Context, path string) ([]byte, error)
	NetworkInterfaces(ctx context.Context) ([]qmp.NetworkInterface, error)
}

// Link switches the child's network link on the host side (the NIC's
// carrier, as the guest sees it).
type Link interface {
	SetLink(ctx context.Context, up bool) error
}

// LinkFunc adapts a function to Link.
type LinkFunc func(ctx context.Context, up bool) error

// SetLink calls f.
func (f LinkFunc) SetLink(ctx context.Context, up bool) error { return f(ctx, up) }

// Child is what a chain knows of the machine it gives an identity.
type Child struct {
	Name     string
	Parent   string
	Template string
	Index    int // position in its fork, from 1
	Mode     Mode
	// MAC is the address the guest is to use. The NIC's MAC in QEMU's
	// configuration stays the template's (the saved device state must
	// match it); the guest changes it, and QEMU's receive filter follows.
	MAC string
	// OldMACs are the MACs the guest may have now (its source's), to find
	// the NIC among several.
	OldMACs []string
	// VMGenID is the child's vmgenid GUID, TemplateVMGenID its template's;
	// both empty for a child that booted fresh.
	VMGenID         string
	TemplateVMGenID string
	// DiskEnv are VMFORK_DISK_<ID>=fresh lines for the disks the child
	// got empty (fork policies fresh and keep): its post-fork hooks make
	// a file system on them.
	DiskEnv []string
}

// Env is what a step works with.
type Env struct {
	Agent Agent
	// Link is nil when the caller does not hold the link down (a child that
	// booted fresh); steps then leave it alone.
	Link  Link
	Child Child
	// Result is what the chain has done so far; steps record their facts
	// (hostname, MAC, addresses) in it.
	Result *Result
	// Now is the host clock; nil means time.Now. Tests inject one.
	Now func() time.Time

	// Slow, if set, says whether the guest is slow rather than dead: it
	// still makes progress on a host too busy to run it at speed. A step
	// whose default time runs out while Slow says so gets its timeout
	// again, up to MaxStretch times (stretch.go); a timeout given with
	// WithTimeout is kept to.
	Slow func() bool

	// Runs, if set, says whether the guest's process has had CPU time
	// since Runs was last asked, and is still there. A retryable step
	// (the agent's: AgentStep) whose time ran out while the guest ran is
	// run once more before the chain fails: its guest was merely late.
	// A guest that got no CPU, or is gone, is stuck or dead and fails
	// as before.
	Runs func() bool

	// StepDone, if set, is called with each step's result as soon as the
	// step has ended (the steps of a batch once the batch has), so that a
	// caller can report progress. It must return quickly.
	StepDone func(StepResult)

	// Facts are what the host read in the child's source before its
	// freeze (ReadFacts); nil when it read nothing. Steps that have a fact
	// skip reading it in the child.
	Facts *Facts

	// HostKeys makes the SSH host keys; nil makes them when they are
	// needed. A fork shares one and has it start early (Prefetch), since an
	// RSA key takes long to make.
	HostKeys *KeyMaker

	detail   string // the running step's detail
	hostname string // the hostname step's new name, once prepared
	mac      string // the network step's new MAC, once prepared

	// Tests run the scripts on the host: root is where their guest's
	// files are, and scriptEnv what batches get in their environment
	// besides PATH and LC_ALL (VMFORK_ROOT, a PATH of stubs).
	root      string
	scriptEnv []string
}

// slow is Env.Slow for a step, nil for a firm one.
func (e *Env) slow(firm bool) func() bool {
	if firm {
		return nil
	}
	return e.Slow
}

func (e *Env) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// Detailf records what the running step did, for its result.
func (e *Env) Detailf(format string, a ...any) { e.detail = fmt.Sprintf(format, a...) }

// StepFunc does a step's work. It returns Skipped(reason) when there is
// nothing to do.
type StepFunc func(ctx context.Context, env *Env) error

// Step is one named unit of a chain. Timeout bounds it (0: only the
// caller's context does). A step does its work in Fn, or gives Run the
// guest side of it as Parts, which Run batches with its neighbours' into one
// guest command (batch.go). A step with both runs Parts.
type Step struct {
	Name    string
	Timeout time.Duration
	Fn      StepFunc
	Parts   PartFunc

	skip string // the reason, for a step made by SkipStep
	// firm: the timeout was given (WithTimeout: a spec, --step-timeout)
	// and is kept to; a default one stretches for a slow guest (Env.Slow).
	firm bool
	// retry: the step only waits for the guest (the agent's), so it may
	// run again when its time ran out while the guest ran (Env.Runs).
	retry bool
}

// Chain is an ordered list of steps. Its methods return a new Chain and
// never change the one they are called on, so a chain can be shared.
type Chain struct {
	steps []Step
}

// NewChain returns a chain of steps.
func NewChain(steps ...Step) Chain { return Chain{steps: append([]Step(nil), steps...)} }

// Steps returns a copy of the steps.
func (c Chain) Steps() []Step { return append([]Step(nil), c.steps...) }

// Len returns the number of steps.
func (c Chain) Len() int { return len(c.steps) }

// Names returns the step names in order.
func (c Chain) Names() []string {
	names := make([]string, len(c.steps))
	for i, s := range c.steps {
		names[i] = s.Name
	}
	return names
}

// Has reports whether the chain has a step called name.
func (c Chain) Has(name string) bool { return c.index(name) >= 0 }

// Step returns the step called name.
func (c Chain) Step(name string) (Step, bool) {
	if i := c.index(name); i >= 0 {
		return c.steps[i], true
	}
	return Step{}, false
}

func (c Chain) index(name string) int {
	for i, s := range c.steps {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// Append returns c with steps added at the end.
func (c Chain) Append(steps ...Step) Chain {
	return Chain{steps: append(c.Steps(), steps...)}
}

// Prepend returns c with steps added at the start.
func (c Chain) Prepend(steps ...Step) Chain {
	return Chain{steps: append(append([]Step(nil), steps...), c.steps...)}
}

// AppendAfter returns c with steps inserted after the step called name; c
// unchanged if it has no such step.
func (c Chain) AppendAfter(name string, steps ...Step) Chain {
	i := c.index(name)
	if i < 0 {
		return c
	}
	out := append([]Step(nil), c.steps[:i+1]...)
	out = append(out, steps...)
	return Chain{steps: append(out, c.steps[i+1:]...)}
}

// Swap returns c with the step called step.Name replaced by step; c
// unchanged if it has no such step.
func (c Chain) Swap(step Step) Chain {
	i := c.index(step.Name)
	if i < 0 {
		return c
	}
	out := c.Steps()
	out[i] = step
	return Chain{steps: out}
}

// Remove returns c without the step called name.
func (c Chain) Remove(name string) Chain {
	out := make([]Step, 0, len(c.steps))
	for _, s := range c.steps {
		if s.Name != name {
			out = append(out, s)
		}
	}
	return Chain{steps: out}
}

// WithTimeout returns c with the timeout of the step called name set to d.
func (c Chain) WithTimeout(name string, d time.Duration) Chain {
	s, ok := c.Step(name)
	if !ok {
		return c
	}
	s.Timeout, s.firm = d, true
	return c.Swap(s)
}

// Skip returns c with the steps called names replaced by steps that do
// nothing and report reason.
func (c Chain) Skip(reason string, names ...string) Chain {
	for _, n := range names {
		if s, ok := c.Step(n); ok {
			c = c.Swap(SkipStep(s.Name, reason))
		}
	}
	return c
}

// Validate checks that every step has a name, a function and a name no
// other step has.
func (c Chain) Validate() error {
	seen := map[string]bool{}
	for i, s := range c.steps {
		switch {
		case s.Name == "":
			return fmt.Errorf("step %d has no name", i+1)
		case s.Fn == nil && s.Parts == nil:
			return fmt.Errorf("step %q has no function", s.Name)
		case seen[s.Name]:
			return fmt.Errorf("step %q is in the chain twice", s.Name)
		case s.Timeout < 0:
			return fmt.Errorf("step %q: timeout %v is negative", s.Name, s.Timeout)
		}
		seen[s.Name] = true
	}
	return nil
}

// SkipStep returns a step called name that does nothing and reports reason.
func SkipStep(name, reason string) Step {
	return Step{Name: name, skip: reason, Fn: func(context.Context, *Env) error { return Skipped(reason) }}
}

// Status is how a step ended.
type Status string

// Step statuses.
const (
	StatusOK      Status = "ok"
	StatusSkipped Status = "skipped" // nothing to do, or told not to
	StatusFailed  Status = "failed"
	StatusNotRun  Status = "not_run" // an earlier step failed
)

// StepResult is what one step did. Its JSON form is part of vmfork's output.
type StepResult struct {
	Name       string  `json:"name"`
	Status     Status  `json:"status"`
	DurationMS float64 `json:"duration_ms"`
	// Detail says what the step did, or why it was skipped.
	Detail string `json:"detail,omitempty"`
	Error  string `json:"error,omitempty"`
	// ExitCode and StderrTail describe the guest command that failed the
	// step, such as a hook.
	ExitCode   *int   `json:"exit_code,omitempty"`
	StderrTail string `json:"stderr_tail,omitempty"`
	// Stretched is how many times the step's timeout was renewed because
	// the guest was slow, not dead (Env.Slow).
	Stretched int `json:"stretched,omitempty"`
	// Retried is 1 when the step's time ran out while its guest still
	// ran, and it was run once more (Env.Runs).
	Retried int `json:"retried,omitempty"`
}

// Result is what a chain did in one child.
type Result struct {
	Mode      Mode     `json:"mode"`
	MAC       string   `json:"mac,omitempty"`
	Hostname  string   `json:"hostname,omitempty"`
	Addresses []string `json:"addresses,omitempty"`
	MachineID string   `json:"machine_id,omitempty"`
	VMGenID   string   `json:"vmgenid,omitempty"`
	// ConnectionsClosed is how many inherited TCP connections the
	// connections step closed (contract.go).
	ConnectionsClosed int     `json:"connections_closed,omitempty"`
	ElapsedMS         float64 `json:"elapsed_ms"`
	// GuestCommands is how many commands the chain ran in the guest, and
	// OverheadMS the part of ElapsedMS no step's duration holds: the round
	// trips and process starts of batched steps, whose durations are
	// measured in the guest.
	GuestCommands int          `json:"guest_commands,omitempty"`
	OverheadMS    float64      `json:"overhead_ms,omitempty"`
	Steps         []StepResult `json:"steps"`
}

// Run runs c's steps in order against env and returns what each did. The
// first step that fails ends the run: the rest are reported not_run and the
// error names the failed step. Run never returns a nil Result.
func Run(ctx context.Context, c Chain, env *Env) (*Result, error) {
	if env.Result == nil {
		env.Result = &Result{}
	}
	res := env.Result
	res.Mode, res.VMGenID = env.Child.Mode, env.Child.VMGenID
	if err := c.Validate(); err != nil {
		return res, err
	}
	start := env.now()
	ca := &countingAgent{Agent: env.Agent}
	env.Agent = ca
	defer func() {
		env.Agent = ca.Agent
		res.ElapsedMS, res.GuestCommands = ms(env.now().Sub(start)), int(ca.n.Load())
	}()
	var failed error
	reported := len(res.Steps) // steps a caller's Result held already
	for i := 0; i < len(c.steps); {
		s := c.steps[i]
		switch {
		case failed != nil:
			res.Steps = append(res.Steps, StepResult{Name: s.Name, Status: StatusNotRun})
			i++
		case s.Parts != nil:
			var n int
			n, failed = runParts(ctx, c.steps[i:], env)
			i += n
		default:
			sr, err := runStep(ctx, s, env)
			res.Steps = append(res.Steps, sr)
			failed = err
			i++
		}
		for ; env.StepDone != nil && reported < len(res.Steps); reported++ {
			env.StepDone(res.Steps[reported])
		}
	}
	var stepsMS float64
	for _, s := range res.Steps {
		stepsMS += s.DurationMS
	}
	res.OverheadMS = max(0, ms(env.now().Sub(start))-stepsMS)
	return res, failed
}

func runStep(ctx context.Context, s Step, env *Env) (StepResult, error) {
	env.detail = ""
	t0 := env.now()
	retryable := s.retry && !s.firm && s.Timeout > 0 && env.Runs != nil
	if retryable {
		env.Runs() // from here: did the guest run during the step?
	}
	stretch, total, err := runStepOnce(ctx, s, env)
	stretched, retried := stretch.Stretched(), 0
	if to, _ := stretch.timedOut(s.Timeout); err != nil && retryable && to && ctx.Err() == nil && env.Runs() {
		// Its time ran out while the guest ran: late, not dead. Once.
		retried = 1
		var more time.Duration
		stretch, more, err = runStepOnce(ctx, s, env)
		total += more
		stretched += stretch.Stretched()
	}
	sr := StepResult{Name: s.Name, Status: StatusOK, DurationMS: ms(env.now().Sub(t0)), Detail: env.detail, Stretched: stretched, Retried: retried}
	var skip *skipError
	switch {
	case err == nil:
		return sr, nil
	case errors.As(err, &skip):
		sr.Status, sr.Detail = StatusSkipped, skip.reason
		return sr, nil
	}
	// A step that ran out of its own time says so; the caller's cancel
	// speaks for itself.
	if stretch != nil && ctx.Err() == nil {
		if to, _ := stretch.timedOut(s.Timeout); to {
			err = fmt.Errorf("timed out after %v: %w", total, err)
		}
	}
	err = fmt.Errorf("step %q: %w", s.Name, err)
	sr.Status, sr.Error = StatusFailed, err.Error()
	var ee *ExitError
	if errors.As(err, &ee) {
		code := ee.Code
		sr.ExitCode, sr.StderrTail = &code, ee.Stderr
	}
	return sr, err
}

// runStepOnce runs s's function once under its timeout (nil stretch: none),
// stretched for a slow guest, and says how long its time was in all.
func runStepOnce(ctx context.Context, s Step, env *Env) (*stretchContext, time.Duration, error) {
	if s.Timeout <= 0 {
		return nil, 0, s.Fn(ctx, env)
	}
	stretch, cancel := withStretch(ctx, s.Timeout, env.slow(s.firm))
	defer cancel()
	err := s.Fn(stretch, env)
	_, total := stretch.timedOut(s.Timeout)
	return stretch, total, err
}

// skipError is what Skipped returns.
type skipError struct{ reason string }

func (e *skipError) Error() string { return "skipped: " + e.reason }

// Skipped is returned by a StepFunc that has nothing to do; reason says why.
func Skipped(reason string) error { return &skipError{reason: reason} }

// ExitError is a guest command that did not exit 0.
type ExitError struct {
	What   string // e.g. `hook "50-fail"`
	Code   int    // exit code, or -1 when killed by Signal
	Signal int
	Stderr string // the tail of its stderr
}

func (e *ExitError) Error() string {
	var b strings.Builder
	b.WriteString(e.What)
	if e.Signal != 0 {
		fmt.Fprintf(&b, " was killed by signal %d", e.Signal)
	} else {
		fmt.Fprintf(&b, " exited with code %d", e.Code)
	}
	if e.Stderr != "" {
		fmt.Fprintf(&b, ": stderr %q", e.Stderr)
	}
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// countingAgent counts the commands a chain runs in the guest.
type countingAgent struct {
	Agent
	n atomic.Int32
}

func (c *countingAgent) Exec(ctx context.Context, req qmp.ExecRequest) (int, error) {
	c.n.Add(1)
	return c.Agent.Exec(ctx, req)
}
