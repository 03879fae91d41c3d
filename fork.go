package vmfork

import (
	"context"
	"errors"
	"fmt"
	"github.com/vmfork/vmfork/contract"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/customize"
	"github.com/vmfork/vmfork/overlay"
)

// FreezeResult is what a freeze cost the source.
type FreezeResult struct {
	Pause          time.Duration
	RAMCopiedBytes int64 // copied while the source was paused
	// RAMMode is how the RAM was frozen (sharedmem's mode: stream, first,
	// diff, copy) and PrecopiedBytes what was copied before the pause;
	// the trace reports both. A driver that cannot tell leaves them zero.
	RAMMode        string
	PrecopiedBytes int64
}

// DefaultMaxChildren bounds one fork call unless ForkRequest.MaxChildren
// says otherwise.
const DefaultMaxChildren = 128

// ForkRequest asks for children of Source. Names, if given, name the
// children; otherwise Count children are named Prefix-1, Prefix-2, ... (the
// next free numbers; Prefix defaults to Source).
type ForkRequest struct {
	// incoming makes the children's state come by migration (fork-serve
	// --incoming, forkto_live.go); set by ServeFork.
	incoming *incomingHooks

	Source      string
	Names       []string
	Count       int
	Prefix      string
	Parallel    int // children started at once; default 4
	MaxChildren int // default DefaultMaxChildren
	// TTL gives every child a deadline (ttl.go) from the moment its record
	// is made, so that the children of a fork whose process dies go too;
	// 0 for none.
	TTL time.Duration
	// Identity says how children get identities of their own (identity.go).
	Identity IdentityOptions
	// DetachDevices unplugs the source's extra devices for the freeze when
	// they forbid it, and plugs them back into the source after; children
	// are made without them.
	DetachDevices bool
	// Contract is the children's contract (contracts.go); nil: they inherit
	// their source's, or their kept template's.
	Contract *contract.Contract
	// DiskPolicies override the source's disk policies for this fork
	// (fork --disk-policy ID=POLICY, disks.go); its children keep the
	// source's for their own forks, but a disk shared stays shared.
	DiskPolicies map[string]DiskPolicy
	// DiskOnly forks only the disks of a running source (fork --disk-only,
	// diskonly.go): its guest's filesystems are frozen for the disk switch,
	// its vCPUs never stop, and the children boot fresh.
	DiskOnly bool
	// CrashConsistent lets a disk-only fork switch the disks without
	// freezing the guest's filesystems, where its agent cannot.
	CrashConsistent bool
	// NoDelta makes the template's RAM one full file where the freeze
	// would make a delta (delta.go; fork --no-delta): for children that
	// will be many, or live long after the source wrote on.
	NoDelta bool
}

// ForkResult is a fork's outcome. Its JSON form is a contract with scripts.
type ForkResult struct {
	Source   string  `json:"source"`
	Template string  `json:"template"`
	PauseMS  float64 `json:"pause_ms"`
	// DiskOnly: the source's vCPUs never stopped (fork --disk-only);
	// FSFrozenMS is how long its guest's filesystems were frozen, 0 for a
	// crash-consistent one.
	DiskOnly   bool          `json:"disk_only,omitempty"`
	FSFrozenMS float64       `json:"fs_frozen_ms,omitempty"`
	Children   []ChildResult `json:"children"`
	Failed     []ChildError  `json:"failed,omitempty"`
	// Admission is what the fork was estimated to take of the host before
	// it began (admission.go).
	Admission *Admission `json:"admission,omitempty"`
}

// ChildResult is one child that came up.
type ChildResult struct {
	Name  string        `json:"name"`
	PID   int           `json:"pid"`
	State State         `json:"state"`
	Ports []PortForward `json:"ports"`
	// RunningMS is from the start of the child's creation until its vCPUs
	// run; ReadyMS until its guest agent answers.
	RunningMS float64 `json:"running_ms"`
	ReadyMS   float64 `json:"ready_ms"`
	// Identity is what the identity chain did in this child.
	Identity *IdentityResult `json:"identity,omitempty"`
}

// ChildError is one child that did not come up.
type ChildError struct {
	Name  string `json:"name"`
	Error string `json:"error"`
	// Identity is what the identity chain did, when the child got that far.
	Identity *IdentityResult `json:"identity,omitempty"`
}

// Fork turns Source into N+1 machines. A running source is paused for a
// fraction of a second and its children continue from that instant; a
// stopped source has only its disk, so its children boot fresh from it.
// Everything that can be checked is checked before the source is paused
// (planFork). When some children fail the others stay, and the error wraps
// ErrPartial.
func (mg *Manager) Fork(ctx context.Context, req ForkRequest) (res *ForkResult, err error) {
	defer func() { err = mg.Store.explainFull(err, 0) }()
	mg.recoverFirst(ctx)
	l := mg.locks()
	defer l.release()
	p, err := mg.planFork(ctx, req, l)
	if err != nil {
		return nil, err
	}
	res, err = mg.applyFork(ctx, p)
	if res != nil {
		res.Admission = p.admission
	}
	return res, err
}

// applyFork carries out plan p; the caller holds its locks.
func (mg *Manager) applyFork(ctx context.Context, p *forkPlan) (res *ForkResult, err error) {
	switch p.mode {
	case forkKept:
		return mg.forkPlanned(ctx, p) // kept.go
	case forkHibernated:
		return mg.forkHibernated(ctx, p) // hibernate.go
	}
	src := p.source
	if p.adopt {
		if err := mg.recordAdoption(src); err != nil {
			return nil, fmt.Errorf("fork: %w", err)
		}
		// A machine adopted for this fork leaves no record when no child
		// comes of it (adopt.go).
		defer func() {
			if err != nil && (res == nil || len(res.Children) == 0) {
				mg.forgetFailedAdoption(ctx, src)
			}
		}()
	}
	f, err := mg.prepareFork(src, p.names(), p.contract, p.req.DiskPolicies, p.mode == forkDiskOnly && !p.req.CrashConsistent)
	if err != nil {
		return nil, fmt.Errorf("fork %q: %w", src.Name, err)
	}
	p.tpl = f.tpl
	mg.applyForkTTL(ctx, p.req.TTL, f.children)
	Fault(FaultForkReserved, src.PID)
	var fsFrozen time.Duration
	switch p.mode {
	case forkLive:
		if err = mg.preFork(ctx, src, f.tpl, p.req.Identity); err == nil {
			err = mg.freezeRunning(ctx, p.forker, src, f.tpl, FreezeOptions{DetachDevices: p.req.DetachDevices, Delta: !p.req.NoDelta, Children: len(f.children)})
		}
	case forkDiskOnly:
		if fsFrozen, err = mg.freezeDiskOnly(ctx, src, f.tpl, p.req.CrashConsistent); err == nil {
			err = mg.frozen(ctx, src, f.tpl, FreezeResult{})
		}
	default:
		err = mg.freezeStopped(ctx, src, f.tpl)
	}
	if err != nil {
		// A source still paused keeps its journal entry: the next command
		// retries the resume.
		f.abort(ctx, !errors.Is(err, ErrStillPaused))
		return nil, fmt.Errorf("fork %q: %w", src.Name, err)
	}
	// Debug: the CLI's progress line comes from the trace (frozen).
	mg.Log.WithFields(logrus.Fields{"machine": src.Name, "template": f.tpl.ID, "pause_ms": f.tpl.PauseMS}).Debug("source frozen")
	Fault(FaultForkFrozen, src.PID)

	inheritDevices(f.tpl, f.children)
	results := mg.startChildren(ctx, p, f.children)
	f.done()
	res, err = mg.forkOutcome(src.Name, f.tpl, f.children, results)
	if res != nil && p.mode == forkDiskOnly {
		res.DiskOnly, res.FSFrozenMS = true, ms(fsFrozen)
	}
	mg.collectTemplates(ctx)
	return res, err
}

// recoverFirst repairs what interrupted commands left (Recover) before a
// command plans; a repair that fails is logged, and the command goes on.
func (mg *Manager) recoverFirst(ctx context.Context) {
	if err := mg.Recover(ctx); err != nil {
		mg.Log.WithError(err).Warn("repairing an interrupted command failed")
	}
}

// forkInProgress is what a fork has created before its children start.
type forkInProgress struct {
	mg       *Manager
	tpl      *Template
	children []*Machine
	done     func() // removes the journal entry
}

// prepareFork creates the template's directory, the journal entry and the
// children's records, in that order, and saves the template's record last:
// from then on the reserved children protect it from collectTemplates.
// thaw marks the journal entry of a fork that freezes the guest's
// filesystems (diskonly.go): its repair thaws them.
func (mg *Manager) prepareFork(src *Machine, names []string, c *contract.Contract, policies map[string]DiskPolicy, thaw bool) (*forkInProgress, error) {
	tpl, err := mg.Store.NewTemplate(src.Name)
	if err != nil {
		return nil, err
	}
	// Recorded with the template before the freeze: the journal's repair
	// finds the extra disks the freeze switched from it.
	if err := planTemplateDisks(src, tpl, policies); err != nil {
		mg.Store.RemoveTemplate(tpl.ID)
		return nil, err
	}
	tpl.Driver, tpl.Accel, tpl.Spec = src.Driver, src.Accel, src.Spec
	tpl.SourceParent, tpl.SourceTemplate, tpl.SourceGuestMAC = src.Parent, src.Template, src.GuestMAC
	tpl.Contract = src.Contract.Clone()
	tpl.Family = familyOf(src)
	if src.Spec.Disk == "" {
		tpl.Paths.Disk = "" // a diskless source freezes no disk
	}
	f := &forkInProgress{mg: mg, tpl: tpl, done: func() {}}
	// The journal entry lives for the whole fork: if this process dies, the
	// next command resumes the source and removes unfinished children.
	if f.done, err = mg.Store.journal(journalEntry{Op: opFork, Source: src.Name, Template: tpl.ID, Machines: names, Thaw: thaw}); err != nil {
		mg.Store.RemoveTemplate(tpl.ID)
		return nil, err
	}
	if f.children, err = mg.reserve(src, tpl, names, c); err == nil {
		err = mg.Store.WriteTemplate(tpl)
	}
	if err != nil {
		mg.release(f.children)
		f.done()
		mg.Store.RemoveTemplate(tpl.ID)
		return nil, err
	}
	return f, nil
}

// abort undoes a fork whose freeze failed. The template goes through
// collectTemplates, which keeps its disk only if the source's chain now
// needs it.
func (f *forkInProgress) abort(ctx context.Context, clearJournal bool) {
	f.mg.release(f.children)
	if clearJournal {
		f.done()
	}
	f.mg.collectTemplates(ctx)
}

func failedSummary(fs []ChildError) string {
	var b strings.Builder
	for i, f := range fs {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", f.Name, f.Error)
	}
	return b.String()
}

// childNames validates the request and returns the children's names.
func (mg *Manager) childNames(req ForkRequest) ([]string, error) {
	if err := CheckTTL(req.TTL); err != nil {
		return nil, err
	}
	max := req.MaxChildren
	if max <= 0 {
		max = DefaultMaxChildren
	}
	count := req.Count
	if len(req.Names) > 0 {
		if count != 0 && count != len(req.Names) {
			return nil, fmt.Errorf("--count %d does not match the %d names given: %w", count, len(req.Names), ErrInvalid)
		}
		count = len(req.Names)
	}
	if count < 1 {
		return nil, fmt.Errorf("child count %d: want at least 1: %w", count, ErrInvalid)
	}
	if count > max {
		return nil, fmt.Errorf("child count %d is over the limit of %d (raise it with --max-children): %w", count, max, ErrInvalid)
	}
	if len(req.Names) > 0 {
		seen := map[string]bool{}
		for _, n := range req.Names {
			if err := ValidateName(n); err != nil {
				return nil, err
			}
			if seen[n] || n == req.Source {
				return nil, fmt.Errorf("child name %q is given twice: %w", n, ErrInvalid)
			}
			seen[n] = true
			if err := mg.Store.nameFree(n); err != nil {
				return nil, err
			}
		}
		return req.Names, nil
	}
	prefix := req.Prefix
	if prefix == "" {
		prefix = req.Source
	}
	var names []string
	for i := 1; len(names) < count; i++ {
		n := fmt.Sprintf("%s-%d", prefix, i)
		if err := ValidateName(n); err != nil {
			return nil, fmt.Errorf("prefix %q: %w", prefix, err)
		}
		if mg.Store.nameFree(n) == nil {
			names = append(names, n)
		}
	}
	return names, nil
}

// reserve creates the children's records (state creating), so that no other
// command takes their names while the fork runs. Each gets contract ct.
func (mg *Manager) reserve(src *Machine, tpl *Template, names []string, ct *contract.Contract) ([]*Machine, error) {
	var children []*Machine
	for _, n := range names {
		c := &Machine{
			Name: n, Driver: src.Driver, State: StateCreating, Accel: src.Accel,
			Spec: src.Spec, Paths: mg.Store.MachinePaths(n), Parent: src.Name, Template: tpl.ID,
			Created: time.Now().UTC(), Contract: ct.Clone(), Family: tpl.Family,
		}
		// Host ports are backends: each child gets free ones of its own.
		c.Spec.Ports = make([]PortForward, len(src.Spec.Ports))
		for i, p := range src.Spec.Ports {
			c.Spec.Ports[i] = PortForward{Guest: p.Guest}
		}
		if err := mg.Store.CreateMachine(c); err != nil {
			mg.release(children)
			return nil, err
		}
		children = append(children, c)
	}
	return children, nil
}

// release removes reserved children that never started.
func (mg *Manager) release(children []*Machine) {
	for _, c := range children {
		if err := mg.Store.RemoveMachine(c.Name); err != nil {
			mg.Log.WithField("machine", c.Name).WithError(err).Warn("could not remove reserved child")
		}
	}
}

// freezeRunning freezes a running source.
func (mg *Manager) freezeRunning(ctx context.Context, forker Forker, src *Machine, tpl *Template, opts FreezeOptions) error {
	fr, err := forker.Freeze(ctx, src, tpl, opts)
	// Saved even on error: once the disk switch is done the source runs on
	// a new top image, whatever failed after it.
	if serr := mg.Store.SaveMachine(src); serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return mg.Store.explainFull(err, int64(src.Spec.MemoryMiB)<<20)
	}
	tpl.HasMemory = true
	tpl.PauseMS = ms(fr.Pause)
	return mg.frozen(ctx, src, tpl, fr)
}

// frozen records template tpl, the fork point just taken of src, and
// tells the trace: every freeze (fork, keep, hibernate) ends here.
func (mg *Manager) frozen(ctx context.Context, src *Machine, tpl *Template, fr FreezeResult) error {
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		return err
	}
	traceOf(ctx).sourceFrozen(FrozenInfo{
		Source: src.Name, Template: tpl.ID, Kept: tpl.Name, Pause: fr.Pause,
		RAMMode: fr.RAMMode, PrecopiedBytes: fr.PrecopiedBytes, RAMCopiedBytes: fr.RAMCopiedBytes, At: time.Now(),
	})
	return nil
}

// freezeStopped freezes a stopped source's disk: the disk moves into the
// template, read-only from now on, and the source gets a new overlay on it,
// so neither the source nor a child can change what the others see.
func (mg *Manager) freezeStopped(ctx context.Context, src *Machine, tpl *Template) error {
	tpl.Paths.RAM, tpl.Paths.DevState = "", ""
	if src.Spec.Disk == "" {
		tpl.Paths.Disk = ""
		return mg.frozen(ctx, src, tpl, FreezeResult{})
	}
	// Moving the disk of a machine that still runs would pull it from under
	// its QEMU: trust the image locks, not the record.
	if busy, err := overlay.InUse(src.Paths.Disk); err != nil || busy {
		if err == nil {
			err = fmt.Errorf("disk %s is in use by a running process: %w", src.Paths.Disk, ErrInvalid)
		}
		return err
	}
	chain, err := overlay.Chain(src.Paths.Disk)
	if err != nil {
		return err
	}
	next := src.Paths.Disk + ".next"
	if err := overlay.CreateOn(ctx, tpl.Paths.Disk, chain[0].Format, chain[0].VirtualSize, next); err != nil {
		return err
	}
	if err := os.Rename(src.Paths.Disk, tpl.Paths.Disk); err != nil {
		os.Remove(next)
		return fmt.Errorf("freeze disk: %w", err)
	}
	if err := os.Rename(next, src.Paths.Disk); err != nil {
		// Put the old top back; the source is unchanged.
		if rerr := os.Rename(tpl.Paths.Disk, src.Paths.Disk); rerr != nil {
			return fmt.Errorf("freeze disk: %w; and restoring %s failed: %v", err, src.Paths.Disk, rerr)
		}
		return fmt.Errorf("freeze disk: %w", err)
	}
	if err := freezeStoppedDisks(ctx, src, tpl); err != nil {
		return err
	}
	// A block disk's top is a new name now (freezeStoppedBlock).
	if err := mg.Store.SaveMachine(src); err != nil {
		return err
	}
	return mg.frozen(ctx, src, tpl, FreezeResult{})
}

// repairFork repairs a fork or template save whose vmfork process died
// (journal.go): the source runs again (resumed if the freeze left it
// paused, on the disk the freeze switched it to), the children that had
// not finished go (repairMachine), and a template reserved but never
// recorded goes; a kept template whose freeze never finished is not kept
// after all. done is false when a name it needs is locked by a live
// command, or a source could not be resumed.
func (mg *Manager) repairFork(ctx context.Context, e journalEntry) (done bool, err error) {
	lockName := e.Source
	var tpl *Template
	if e.Template != "" {
		if t, err := mg.Store.LoadTemplate(e.Template); err == nil {
			tpl = t
			if lockName == "" {
				lockName = t.Name // a fork of a kept template holds its name
			}
		}
	}
	if lockName != "" {
		unlock, err := mg.tryLock(ctx, lockName)
		if err != nil {
			return false, nil
		}
		defer unlock()
	}
	if src, err := mg.Store.LoadMachine(e.Source); err == nil && src.Driver == mg.Driver.Name() {
		if tpl != nil {
			if err := mg.repairSourceDisk(ctx, src, tpl); err != nil {
				return false, fmt.Errorf("repair %q after an interrupted %s: %w", e.Source, e.Op, err)
			}
		}
		if e.Thaw {
			if st, _ := mg.Driver.Status(ctx, src); st == StateRunning {
				// An agent that does not answer cannot thaw anything, now
				// or at the next command: warned, not retried.
				if err := mg.thawAfterCrash(ctx, src); err != nil {
					mg.Log.WithField("machine", e.Source).WithError(err).Warn("could not thaw the filesystems an interrupted disk-only fork may have frozen")
				}
			}
		}
		if forker, ok := mg.Driver.(Forker); ok {
			if st, _ := mg.Driver.Status(ctx, src); st != StateStopped {
				if err := forker.Resume(ctx, src); err != nil {
					return false, fmt.Errorf("resume %q after an interrupted %s: %w", e.Source, e.Op, err)
				}
				mg.Log.WithField("machine", e.Source).Warn("made sure a machine an interrupted fork had paused runs")
			}
		}
	}
	done, err = mg.repairMachines(ctx, e)
	if e.Template == "" {
		return done, err
	}
	var errs []error
	if tpl == nil {
		// Reserved but never recorded: nothing can use it.
		mg.Store.RemoveTemplate(e.Template)
	} else if tpl.Name != "" && !tpl.HasMemory && tpl.Paths.RAM != "" {
		// A kept template whose freeze never finished: not kept after
		// all, and collectTemplates takes it.
		tpl.Name, tpl.PoolSize = "", 0
		if werr := mg.Store.WriteTemplate(tpl); werr != nil {
			errs = append(errs, werr)
		}
		mg.Log.WithField("template", tpl.ID).Warn("gave up a template an interrupted save left half-made")
	}
	mg.Store.removeTempFiles(e.Template)
	if tpl != nil && !tpl.HasMemory {
		// The freeze never finished (its record would say so): whatever
		// RAM it made, a whole delta and its base's name included, is
		// never used, and would hold tmpfs (the base: a whole RAM file)
		// for as long as the template's disk is a layer.
		mg.Store.clearTemplateRAM(e.Template)
	}
	return done && len(errs) == 0, errors.Join(append([]error{err}, errs...)...)
}

type childOutcome struct {
	ChildResult
	err error
}

// startChildren starts plan p's reserved children, at most p.req.Parallel
// at once and fewer on a busy host (pace.go).
func (mg *Manager) startChildren(ctx context.Context, p *forkPlan, children []*Machine) []childOutcome {
	req, tpl, live := p.req, p.tpl, p.live()
	parallel := req.Parallel
	if parallel <= 0 {
		parallel = 4
	}
	// A kept template's warm pool serves the first children. Its members
	// have fresh vmgenids, so a reproducible identity starts cold.
	var members []*Machine
	// Nor do children whose contract the host enforces: a member's QEMU was
	// started without their egress rules, outside their cgroup, and
	// unknown to the broker. Guest steps alone (connections, secret
	// files) run after a member is claimed, as on any child.
	if live && tpl.Name != "" && req.incoming == nil && req.Identity.Spec.Mode() != customize.ModeReproducible && !p.contract.OnHost() {
		members = mg.takePool(ctx, tpl, len(children))
	}
	out := make([]childOutcome, len(children))
	// At most parallel at once, fewer while the CPUs are contended and
	// the children's chains slow down (pace.go).
	pace := newPacer(parallel, mg.host(), mg.Log)
	var wg sync.WaitGroup
	ident := req.Identity
	ident.forkNonce = newUUID()
	ident.stepEnded = pace.stepEnded
	for i, c := range children {
		cs := childStart{tpl: tpl, child: c, index: i + 1, mode: childBoot, identity: ident}
		switch {
		case i < len(members):
			cs.mode, cs.member = childFromPool, members[i]
		case req.incoming != nil:
			cs.mode, cs.incoming = childIncoming, req.incoming
		case live:
			cs.mode = childLoad
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Without a slot (ctx ended) the child fails at once, cleaned up.
			if pace.acquire(ctx) == nil {
				defer pace.release()
			}
			out[i] = mg.startChild(ctx, p.forker, cs)
		}()
	}
	wg.Wait()
	return out
}

// startChild starts child cs.child, the cs.index-th of its fork, the way
// cs.mode says, and gives it its identity. A child whose identity chain
// fails is killed, or kept with its network link down when cs.identity says
// so; either way it counts as failed.
func (mg *Manager) startChild(ctx context.Context, forker Forker, cs childStart) (o childOutcome) {
	tpl, c, index, member, opts := cs.tpl, cs.child, cs.index, cs.member, cs.identity
	log := mg.Log.WithFields(logrus.Fields{"machine": c.Name, "template": tpl.ID})
	tr := traceOf(ctx)
	start := time.Now()
	tr.childStarted(ChildStartInfo{Child: c.Name, Template: tpl.ID, Index: index, Pooled: cs.mode == childFromPool, At: start})
	keep := false
	defer func() {
		if o.err == nil {
			return
		}
		log.WithError(o.err).Debug("child failed") // the CLI prints it from the trace
		if !keep {
			if c.PID != 0 {
				mg.Driver.Stop(context.WithoutCancel(ctx), c, true)
			}
			mg.unbroker(context.WithoutCancel(ctx), c)
			mg.detachLedger(ctx, c)
			if err := mg.Store.RemoveMachine(c.Name); err != nil {
				log.WithError(err).Warn("could not remove the failed child's files")
			}
		}
		tr.childFailed(ChildFailedInfo{Child: c.Name, Err: o.err, Identity: o.Identity, At: time.Now()})
	}()
	if tpl.Paths.Disk != "" && cs.mode != childFromPool {
		if err := overlay.Create(ctx, tpl.Paths.Disk, c.Paths.Disk); err != nil {
			return childOutcome{err: err}
		}
		if err := childDisks(ctx, tpl, c); err != nil {
			return childOutcome{err: err}
		}
	}
	if err := mg.prepareIdentity(c, tpl, index, opts); err != nil {
		return childOutcome{err: err}
	}
	// Registered before its QEMU starts: the driver forwards the guest's
	// proxy address to the listener the broker opens.
	brokered, err := mg.brokerSecrets(ctx, c, index)
	if err != nil {
		return childOutcome{err: err}
	}
	switch cs.mode {
	case childFromPool:
		// The member's overlay, process, ports and vmgenid become the
		// child's; only the device state remains to load.
		if err := mg.claimMember(c, member); err != nil {
			return childOutcome{err: err}
		}
		Fault(FaultPoolTaken, c.PID)
		if err := forker.(Pooler).Complete(ctx, c, tpl); err != nil {
			return childOutcome{err: err}
		}
	case childLoad:
		c.Paths.RAM, c.Paths.RAMShared = tpl.MappedRAM(), false
		if err := mg.Store.SaveMachine(c); err != nil {
			return childOutcome{err: err}
		}
		if err := forker.StartChild(ctx, c, tpl); err != nil {
			return childOutcome{err: err}
		}
	case childIncoming:
		if err := mg.startIncoming(ctx, c, tpl, cs.incoming); err != nil {
			return childOutcome{err: err}
		}
		// A migration that breaks kills the child: its identity chain,
		// stuck on pages that never come, then fails at once.
		go mg.awaitIncoming(ctx, c)
	default:
		if err := mg.Driver.Start(ctx, c); err != nil {
			return childOutcome{err: err}
		}
	}
	running := time.Since(start)
	brokered(ctx)
	// At once, before the identity chain: the guest continues from its
	// source's instant, where a program may be about to claim.
	mg.attachLedger(ctx, c)
	// The child stays "creating" until its identity chain has finished and
	// its link is up: until then it is its parent's double, and the
	// journal's repair removes it if this process dies (journal.go).
	if err := mg.Store.SaveMachine(c); err != nil {
		return childOutcome{err: err}
	}
	Fault(FaultForkRunning, c.PID)
	tr.childRunning(ChildRunningInfo{Child: c.Name, PID: c.PID, Running: running, At: time.Now()})
	result := ChildResult{Name: c.Name, PID: c.PID, Ports: c.Spec.Ports, RunningMS: ms(running)}
	opts.Edit = faultIdentity(opts.Edit, c)
	id, err := mg.applyIdentity(ctx, c, tpl, index, cs.live(), opts)
	result.Identity = id
	if err != nil {
		if keep = opts.KeepOnFailure; keep {
			// Kept on request, link down, for inspection: the fork reports
			// it failed.
			c.State = StateRunning
			mg.Store.SaveMachine(c)
		}
		return childOutcome{ChildResult: result, err: fmt.Errorf("identity: %w", err)}
	}
	c.State, result.State = StateRunning, StateRunning
	if err := mg.Store.SaveMachine(c); err != nil {
		return childOutcome{ChildResult: result, err: err}
	}
	ready := time.Now()
	result.ReadyMS = ms(ready.Sub(start))
	log.WithFields(logrus.Fields{"running_ms": result.RunningMS, "ready_ms": result.ReadyMS}).Debug("child ready")
	tr.childReady(ChildReadyInfo{ChildResult: result, At: ready})
	return childOutcome{ChildResult: result}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
