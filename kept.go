package vmfork

import (
	"context"
	"errors"
	"fmt"
	"github.com/vmfork/vmfork/contract"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/overlay"
)

// A kept template is a fork point with a name: `vmfork template save SRC
// NAME` freezes a running machine once (it pauses as for a fork, and carries
// on), and `vmfork fork NAME` makes children from that instant any time
// later, without touching the source again. It is never collected; `vmfork
// template rm` gives it up, and its memory goes once no child maps it. Kept
// template names share the namespace of machine names, so `fork NAME` is
// never ambiguous.

// KeepRequest asks to keep machine Source's current instant (a stopped
// machine's: its disk) as template Name.
type KeepRequest struct {
	Source string
	Name   string
	// Pool is how many processes to keep started ahead (pool.go).
	Pool int
	// Identity supplies the source's pre-fork hooks (run before the freeze).
	Identity IdentityOptions
	// Contract is the one the template's children get (contracts.go); nil:
	// the source's.
	Contract *contract.Contract
	// delta lets the freeze keep the RAM as a delta on the source's file,
	// as a local fork's (FreezeOptions.Delta): fork --to's live path, whose
	// only QEMU of the template is one the driver starts (forkto_live.go).
	delta bool
}

// TemplateStatus is a template as `vmfork template ls` shows it. Its JSON
// form is a contract with scripts.
type TemplateStatus struct {
	Name      string    `json:"name,omitempty"` // empty for a live fork's template
	ID        string    `json:"id"`
	Source    string    `json:"source"`
	Created   time.Time `json:"created"`
	MemoryMiB int       `json:"memory_mib"`
	HasMemory bool      `json:"has_memory"`
	// RAMBytes is what the frozen RAM file holds (its allocated extents);
	// for a delta, what the delta holds: the RAM it holds alone.
	RAMBytes int64 `json:"ram_bytes"`
	// RAMDelta says the RAM is a delta on a base file that is another's
	// (delta.go), applied after Depth-1 others.
	RAMDelta bool `json:"ram_delta,omitempty"`
	// What the RAM is made of (full file or delta chain, its depth) and
	// what the template holds alone; set while it has memory.
	*DeltaStats
	PauseMS float64 `json:"pause_ms,omitempty"`
	// Children counts machines that map the template's RAM now.
	Children int `json:"children"`
	PoolSize int `json:"pool_size"`
	Pooled   int `json:"pooled"` // live members of the warm pool
	// RAMLost: the template held RAM that a host restart took
	// (restart.go); no child can start from it.
	RAMLost bool `json:"ram_lost,omitempty"`
}

// FindKept returns the template kept under name; ErrNotFound if none is.
func (s *Store) FindKept(name string) (*Template, error) {
	ts, err := s.ListTemplates()
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		if t.Name == name {
			return t, nil
		}
	}
	return nil, fmt.Errorf("template %q: %w", name, ErrNotFound)
}

// keepPlan is a template save resolved and checked once (planKeep).
type keepPlan struct {
	command string // "template save" or "checkpoint"
	req     KeepRequest
	forker  Forker
	src     *Machine
	// live: src runs, and its instant (memory and all) is kept; else only
	// its disk.
	live bool
	// admission is what the freeze and the pool will take (admission.go).
	admission *Admission
}

// planKeep checks a save of machine req.Source as template req.Name, taking
// the template name's lock and then the source's in l. It changes nothing.
// verb ("keep", "checkpoint") starts its errors.
func (mg *Manager) planKeep(ctx context.Context, verb string, req KeepRequest, l *lockSet) (*keepPlan, error) {
	forker, ok := mg.Driver.(Forker)
	if !ok {
		return nil, fmt.Errorf("%s %q: driver %q: %w", verb, req.Source, mg.Driver.Name(), ErrUnsupported)
	}
	if err := mg.checkKeepRequest(verb, req); err != nil {
		return nil, err
	}
	if err := l.take(ctx, req.Name); err != nil {
		return nil, fmt.Errorf("%s %q: %w", verb, req.Source, err)
	}
	if err := mg.Store.nameFree(req.Name); err != nil {
		return nil, fmt.Errorf("%s %q as %q: %w", verb, req.Source, req.Name, err)
	}
	if err := l.take(ctx, req.Source); err != nil {
		return nil, fmt.Errorf("%s %q: %w", verb, req.Source, err)
	}
	src, err := mg.Get(ctx, req.Source)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", verb, err)
	}
	if src.Driver != mg.Driver.Name() {
		return nil, fmt.Errorf("%s %q: machine belongs to driver %q: %w", verb, src.Name, src.Driver, ErrInvalid)
	}
	live, err := checkKeepSource(verb, src, req.Pool)
	if err != nil {
		return nil, err
	}
	if err := mg.checkContract(ctx, verb, src.Name, src, req.Contract); err != nil {
		return nil, err
	}
	p := &keepPlan{command: "template save", req: req, forker: forker, src: src, live: live}
	if live {
		d := mg.childDemand(fmt.Sprintf("%s %q", verb, src.Name), "pool members", src, req.Pool, true)
		d.disk += freezeDisk
		d.memDir += freezeMemDir(src)
		if p.admission, err = mg.admit(d); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Keep freezes machine req.Source into a template kept as req.Name and
// starts its warm pool. A running source pauses as for a fork and runs on;
// a stopped source's template holds only its disk, and children of it boot
// fresh from a copy-on-write overlay.
// When only the pool fails the template is kept and the error wraps
// ErrPartial.
func (mg *Manager) Keep(ctx context.Context, req KeepRequest) (t *Template, err error) {
	defer func() { err = mg.Store.explainFull(err, 0) }()
	mg.recoverFirst(ctx)
	l := mg.locks()
	defer l.release()
	p, err := mg.planKeep(ctx, "keep", req, l)
	if err != nil {
		return nil, err
	}
	return mg.applyKeep(ctx, p)
}

// PlanKeep checks a template save as Keep does and says what it would do.
func (mg *Manager) PlanKeep(ctx context.Context, req KeepRequest) (*Plan, error) {
	return dryRun(mg.planKeep(ctx, "keep", req, noLocks()))
}

func (p *keepPlan) render() *Plan {
	req := p.req
	out := &Plan{Command: p.command, Changed: true, Source: p.src.Name, Template: req.Name, SourcePauses: p.live}
	if p.live {
		out.add("pause running machine %q for a fraction of a second and keep that instant as template %q; it carries on", p.src.Name, req.Name)
	} else {
		out.add("keep stopped machine %q's disk as template %q (children boot fresh from it); the machine gets an overlay on it", p.src.Name, req.Name)
	}
	if req.Pool > 0 {
		out.add("start %d warm-pool processes of template %q", req.Pool, req.Name)
	}
	out.Contract = p.src.Contract
	if req.Contract != nil {
		out.Contract = req.Contract
		out.add("give the template's children this contract: %s", strings.TrimPrefix(describeContract(req.Contract), "enforce the contract: "))
	}
	if p.admission != nil {
		out.add("%s", p.admission.describe())
		out.Admission = p.admission
	}
	return out
}

// applyKeep carries out plan p; the caller holds its locks.
func (mg *Manager) applyKeep(ctx context.Context, p *keepPlan) (t *Template, err error) {
	src, req := p.src, p.req
	f, err := mg.prepareFork(src, nil, nil, nil, false)
	if err != nil {
		return nil, fmt.Errorf("keep %q: %w", src.Name, err)
	}
	t = f.tpl
	t.Name, t.PoolSize = req.Name, req.Pool
	if req.Contract != nil {
		t.Contract = req.Contract.Clone()
	}
	if err = mg.Store.WriteTemplate(t); err == nil {
		Fault(FaultSaveReserved, src.PID)
		if !p.live {
			// Disk only: the disk moves into the template, the source
			// gets an overlay on it (fork.go).
			err = mg.freezeStopped(ctx, src, t)
		} else if err = mg.preFork(ctx, src, t, req.Identity); err == nil {
			err = mg.freezeRunning(ctx, p.forker, src, t, FreezeOptions{Delta: req.delta})
		}
	}
	if err != nil {
		// Not kept after all: collectTemplates may take it.
		t.Name, t.PoolSize = "", 0
		mg.Store.WriteTemplate(t)
		f.abort(ctx, !errors.Is(err, ErrStillPaused))
		return nil, fmt.Errorf("keep %q: %w", src.Name, err)
	}
	Fault(FaultSaveFrozen, src.PID)
	f.done()
	mg.Log.WithFields(logrus.Fields{"machine": src.Name, "template": t.ID, "name": t.Name, "pause_ms": t.PauseMS}).Info("template kept")
	if err := mg.fillPool(ctx, t); err != nil {
		return t, fmt.Errorf("keep %q: %w: %w", src.Name, err, ErrPartial)
	}
	return t, nil
}

// checkKeepSource checks that src can be kept, with a pool of the given
// size, and reports whether it runs: a stopped machine's template holds
// only its disk.
func checkKeepSource(verb string, src *Machine, pool int) (live bool, err error) {
	live = src.State == StateRunning
	if !live && src.State != StateStopped {
		return false, fmt.Errorf("%s %q: machine is %s; only a running or stopped machine can be kept: %w", verb, src.Name, src.State, ErrInvalid)
	}
	if !live && src.Adopted != nil {
		// As for a fork: a stopped adopted machine's record holds too
		// little of its own definition to boot children from.
		return false, fmt.Errorf("%s %q: an adopted machine is kept only while it runs, and it is %s: %w", verb, src.Name, src.State, ErrInvalid)
	}
	if !live && pool > 0 {
		return false, fmt.Errorf("%s %q: the machine is stopped, so its template holds only its disk and children boot fresh: no warm pool (use --pool 0): %w", verb, src.Name, ErrInvalid)
	}
	return live, nil
}

func checkPoolSize(n int) error {
	if n < 0 || n > MaxPoolSize {
		return fmt.Errorf("pool size %d must be from 0 to %d: %w", n, MaxPoolSize, ErrInvalid)
	}
	return nil
}

// keptPlan is a change to kept template t (template pool, template rm),
// resolved and checked once.
type keptPlan struct {
	verb string // "template pool" or "template rm"
	t    *Template
	size int            // template pool: the new pool size
	st   TemplateStatus // what the template holds and serves now
	// admission is what a bigger pool's new members will take.
	admission *Admission
}

// planKept resolves kept template name for verb, taking its lock in l.
func (mg *Manager) planKeptChange(ctx context.Context, verb, name string, l *lockSet) (*keptPlan, error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if err := l.take(ctx, name); err != nil {
		return nil, fmt.Errorf("template %q: %w", name, err)
	}
	t, err := mg.Store.FindKept(name)
	if err != nil {
		return nil, err
	}
	return &keptPlan{verb: verb, t: t, st: mg.templateStatus(ctx, t, nil)}, nil
}

// planPool checks a resize of kept template name's pool to size.
func (mg *Manager) planPool(ctx context.Context, name string, size int, l *lockSet) (*keptPlan, error) {
	if err := checkPoolSize(size); err != nil {
		return nil, fmt.Errorf("template %q: %w", name, err)
	}
	p, err := mg.planKeptChange(ctx, "template pool", name, l)
	if err != nil {
		return nil, err
	}
	p.size = size
	if size > 0 {
		if _, ok := mg.Driver.(Pooler); !ok {
			return nil, fmt.Errorf("template %q: driver %q has no warm pool: %w", name, mg.Driver.Name(), ErrUnsupported)
		}
		if !p.t.HasMemory {
			return nil, fmt.Errorf("template %q holds only a disk and its children boot fresh: no warm pool (use 0): %w", name, ErrInvalid)
		}
		if err := checkRAMKept("template pool", p.t); err != nil {
			return nil, err
		}
		// Pool members load the template: refuse one that does not fit
		// this host before starting any (compat.go).
		if err := mg.CheckTemplate(ctx, p.t); err != nil {
			return nil, fmt.Errorf("template %q: %w", name, err)
		}
		if size > p.st.Pooled {
			var err error
			if p.admission, err = mg.admit(mg.poolDemand(p.t, size-p.st.Pooled)); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// SetPool changes kept template name's pool size and starts or stops
// members to match.
func (mg *Manager) SetPool(ctx context.Context, name string, size int) (*TemplateStatus, error) {
	l := mg.locks()
	defer l.release()
	p, err := mg.planPool(ctx, name, size, l)
	if err != nil {
		return nil, err
	}
	t := p.t
	t.PoolSize = size
	if err := mg.Store.WriteTemplate(t); err != nil {
		return nil, err
	}
	err = mg.fillPool(ctx, t)
	st := mg.templateStatus(ctx, t, nil)
	return &st, err
}

// PlanPool checks a pool resize as SetPool does and says what it would do.
func (mg *Manager) PlanPool(ctx context.Context, name string, size int) (*Plan, error) {
	return dryRun(mg.planPool(ctx, name, size, noLocks()))
}

// Unkeep gives up kept template name: its pool stops, and it is removed as
// soon as no child maps its memory. It reports whether it is gone already.
func (mg *Manager) Unkeep(ctx context.Context, name string) (gone bool, err error) {
	l := mg.locks()
	defer l.release()
	p, err := mg.planKeptChange(ctx, "template rm", name, l)
	if err != nil {
		return false, err
	}
	t := p.t
	mg.removePool(ctx, t.ID)
	t.Name, t.PoolSize = "", 0
	if err := mg.Store.WriteTemplate(t); err != nil {
		return false, err
	}
	mg.collectTemplates(ctx)
	_, err = mg.Store.LoadTemplate(t.ID)
	return errors.Is(err, ErrNotFound), nil
}

// PlanUnkeep checks a template rm as Unkeep does and says what it would do.
func (mg *Manager) PlanUnkeep(ctx context.Context, name string) (*Plan, error) {
	return dryRun(mg.planKeptChange(ctx, "template rm", name, noLocks()))
}

func (p *keptPlan) render() *Plan {
	name, st := p.t.Name, p.st
	out := &Plan{Command: p.verb, Template: name}
	if p.verb == "template pool" {
		switch {
		case p.size > st.Pooled:
			out.add("start %d warm-pool processes of template %q (it has %d)", p.size-st.Pooled, name, st.Pooled)
		case p.size < st.Pooled:
			out.add("stop %d of the %d warm-pool processes of template %q", st.Pooled-p.size, st.Pooled, name)
		}
		if p.size != p.t.PoolSize {
			out.add("record template %q's pool size as %d (was %d)", name, p.size, p.t.PoolSize)
		}
		if p.admission != nil {
			out.add("%s", p.admission.describe())
			out.Admission = p.admission
		}
		out.Changed = len(out.Actions) > 0
		return out
	}
	out.Changed = true
	if st.Pooled > 0 {
		out.add("stop the %d warm-pool processes of template %q", st.Pooled, name)
	}
	if st.Children > 0 {
		out.add("give up the name %q; template %s stays until its %d children are gone", name, p.t.ID, st.Children)
	} else {
		out.add("remove template %q (%s) with its RAM, device state and frozen disk unless a disk builds on it", name, p.t.ID)
	}
	return out
}

// Templates lists every template: kept ones and those of live forks that
// children still map.
func (mg *Manager) Templates(ctx context.Context) ([]TemplateStatus, error) {
	ts, err := mg.Store.ListTemplates()
	if err != nil {
		return nil, err
	}
	ms, err := mg.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]TemplateStatus, 0, len(ts))
	for _, t := range ts {
		out = append(out, mg.templateStatus(ctx, t, ms))
	}
	return out, nil
}

// templateStatus describes t; ms are the machines, or nil to read them.
func (mg *Manager) templateStatus(ctx context.Context, t *Template, ms []*Machine) TemplateStatus {
	if ms == nil {
		ms, _ = mg.List(ctx)
	}
	st := TemplateStatus{
		Name: t.Name, ID: t.ID, Source: t.Source, Created: t.Created, MemoryMiB: t.Spec.MemoryMiB,
		HasMemory: t.HasMemory, PauseMS: t.PauseMS, PoolSize: t.PoolSize, RAMLost: TemplateRAMLost(t),
	}
	if t.HasMemory {
		st.RAMBytes, _ = overlay.AllocatedBytes(t.Paths.RAM)
		if t.RAMDelta != nil {
			// What it holds alone; the base is counted with whoever
			// else names it.
			st.RAMBytes, _ = overlay.AllocatedBytes(t.RAMDelta.Pages)
			st.RAMDelta = true
		}
		ds := deltaStats(t)
		st.DeltaStats = &ds
	}
	for _, m := range ms {
		if m.Template == t.ID && m.mapsTemplate() {
			st.Children++
		}
	}
	members, _ := mg.Store.listPool(t.ID)
	for _, m := range members {
		if s, _ := mg.Driver.Status(ctx, m); s != StateStopped {
			st.Pooled++
		}
	}
	return st
}

// forkPlanned makes the children of plan p's kept template (a hibernated
// machine's too: hibernate.go); the caller holds the plan's locks. Pool members become the first children; the
// pool is refilled once every child is up.
func (mg *Manager) forkPlanned(ctx context.Context, p *forkPlan) (*ForkResult, error) {
	req, t := p.req, p.tpl
	done, err := mg.Store.journal(journalEntry{Op: opFork, Template: t.ID, Machines: p.names()})
	if err != nil {
		return nil, fmt.Errorf("fork %q: %w", req.Source, err)
	}
	children, err := mg.reserve(p.source, t, p.names(), p.contract)
	if err != nil {
		done()
		return nil, fmt.Errorf("fork %q: %w", req.Source, err)
	}
	mg.applyForkTTL(ctx, req.TTL, children)
	// A template of a stopped machine holds only its disk: its children
	// boot fresh from an overlay on it.
	results := mg.startChildren(ctx, p, children)
	done()
	res, err := mg.forkOutcome(req.Source, t, children, results)
	res.PauseMS = 0 // nothing was paused: the source paid at the save
	if perr := mg.fillPool(ctx, t); perr != nil {
		mg.Log.WithError(perr).Warn("could not refill the warm pool")
	}
	return res, err
}

// forkOutcome gathers the children's results into a ForkResult and its error.
func (mg *Manager) forkOutcome(source string, t *Template, children []*Machine, results []childOutcome) (*ForkResult, error) {
	res := &ForkResult{Source: source, Template: t.ID, PauseMS: t.PauseMS, Children: []ChildResult{}}
	for i, r := range results {
		if r.err != nil {
			res.Failed = append(res.Failed, ChildError{Name: children[i].Name, Error: r.err.Error(), Identity: r.Identity})
			continue
		}
		res.Children = append(res.Children, r.ChildResult)
	}
	switch {
	case len(res.Failed) == 0:
		return res, nil
	case len(res.Children) == 0:
		return res, fmt.Errorf("fork %q: no child came up: %s", source, failedSummary(res.Failed))
	default:
		return res, fmt.Errorf("fork %q: %d of %d children came up; failed: %s: %w",
			source, len(res.Children), len(children), failedSummary(res.Failed), ErrPartial)
	}
}

// checkKeepRequest checks what a template save needs from its request
// alone.
func (mg *Manager) checkKeepRequest(verb string, req KeepRequest) error {
	if err := ValidateName(req.Source); err != nil {
		return fmt.Errorf("%s: %w", verb, err)
	}
	if err := ValidateName(req.Name); err != nil {
		return fmt.Errorf("%s %q: template %w", verb, req.Source, err)
	}
	if err := checkPoolSize(req.Pool); err != nil {
		return fmt.Errorf("%s %q: %w", verb, req.Source, err)
	}
	if _, ok := mg.Driver.(Pooler); req.Pool > 0 && !ok {
		return fmt.Errorf("%s %q: driver %q has no warm pool (use --pool 0): %w", verb, req.Source, mg.Driver.Name(), ErrUnsupported)
	}
	if err := req.Identity.Validate(); err != nil {
		return fmt.Errorf("%s %q: %w", verb, req.Source, err)
	}
	return nil
}
