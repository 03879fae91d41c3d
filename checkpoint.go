package vmfork

import (
	"context"
	"errors"
	"fmt"
	"github.com/vmfork/vmfork/contract"
	"os"
	"slices"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/customize"
	"github.com/vmfork/vmfork/overlay"
)

// A checkpoint is a kept template of a running machine's instant (kept.go);
// the machine runs on. A rewind replaces the machine's QEMU by a fork of a
// checkpoint that takes the machine's place: its name, directory, record,
// guest MAC, host ports and lineage stay, and its identity is applied again
// (clock, vmgenid, MAC and lease, hooks). A rewind to the machine's own
// checkpoint keeps the hostname, machine-id and SSH host keys the checkpoint
// holds, which are the machine's own; a forced rewind to another machine's
// checkpoint gives it its name as hostname and fresh ones.

// FaultRewindRunning: a rewind's new QEMU runs; its identity chain has
// not run and the machine's record says creating (fault.go).
const FaultRewindRunning = "rewind.running"

// CheckpointRequest asks to keep running machine Machine's instant as
// template As (default: the next free "<machine>-cpN").
type CheckpointRequest struct {
	Machine  string
	As       string
	Identity IdentityOptions
	// Contract is the one the checkpoint's children get; nil: the
	// machine's (a rewind keeps the machine's own either way).
	Contract *contract.Contract
}

// planCheckpoint checks a checkpoint of req.Machine: a template save of a
// running machine under req.As or the next free checkpoint name.
func (mg *Manager) planCheckpoint(ctx context.Context, req CheckpointRequest, l *lockSet) (*keepPlan, error) {
	if err := ValidateName(req.Machine); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	name := req.As
	if name == "" {
		var err error
		if name, err = mg.nextCheckpointName(req.Machine); err != nil {
			return nil, fmt.Errorf("checkpoint %q: %w", req.Machine, err)
		}
	}
	p, err := mg.planKeep(ctx, "checkpoint", KeepRequest{Source: req.Machine, Name: name, Identity: req.Identity, Contract: req.Contract}, l)
	if err != nil {
		return nil, err
	}
	if !p.live {
		return nil, fmt.Errorf("checkpoint %q: machine is %s: %w", p.src.Name, p.src.State, ErrNotRunning)
	}
	p.command = "checkpoint"
	return p, nil
}

// Checkpoint keeps running machine req.Machine's current instant as a
// template; the machine pauses as for a fork and runs on.
func (mg *Manager) Checkpoint(ctx context.Context, req CheckpointRequest) (*Template, error) {
	mg.recoverFirst(ctx)
	l := mg.locks()
	defer l.release()
	p, err := mg.planCheckpoint(ctx, req, l)
	if err != nil {
		return nil, err
	}
	return mg.applyKeep(ctx, p)
}

// PlanCheckpoint checks a checkpoint as Checkpoint does and says what it
// would do.
func (mg *Manager) PlanCheckpoint(ctx context.Context, req CheckpointRequest) (*Plan, error) {
	return dryRun(mg.planCheckpoint(ctx, req, noLocks()))
}

func (mg *Manager) nextCheckpointName(machine string) (string, error) {
	for n := 1; n < 1<<20; n++ {
		name := fmt.Sprintf("%s-cp%d", machine, n)
		if err := ValidateName(name); err != nil {
			return "", fmt.Errorf("no checkpoint name fits (give one with --as): %w", err)
		}
		_, merr := mg.Store.LoadMachine(name)
		_, terr := mg.Store.FindKept(name)
		if errors.Is(merr, ErrNotFound) && errors.Is(terr, ErrNotFound) {
			return name, nil
		}
	}
	return "", fmt.Errorf("no free checkpoint name: %w", ErrExists)
}

// Checkpoints lists the kept templates of machine's instants, oldest first.
func (mg *Manager) Checkpoints(ctx context.Context, machine string) ([]TemplateStatus, error) {
	if err := ValidateName(machine); err != nil {
		return nil, err
	}
	all, err := mg.Templates(ctx)
	if err != nil {
		return nil, err
	}
	out := []TemplateStatus{}
	for _, t := range all {
		if t.Name != "" && t.Source == machine {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b TemplateStatus) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// RewindRequest asks to replace machine Machine's live state with kept
// template To's. Force allows a template of another machine.
type RewindRequest struct {
	Machine  string
	To       string
	Force    bool
	Identity IdentityOptions
}

// rewindPlan is a rewind resolved and checked once.
type rewindPlan struct {
	req     RewindRequest
	starter InPlaceStarter
	m       *Machine
	t       *Template
	// opts are the identity options the rewind's chain runs with.
	opts IdentityOptions
}

// planRewind checks a rewind of req.Machine to kept template req.To,
// taking the template name's lock and then the machine's in l (the order
// Keep takes).
func (mg *Manager) planRewind(ctx context.Context, req RewindRequest, l *lockSet) (*rewindPlan, error) {
	// A rewound machine's new process starts from a record whose files
	// stay where the old one's were: only a driver that can start in
	// place can (InPlaceStarter).
	if _, ok := mg.Driver.(Forker); !ok {
		return nil, fmt.Errorf("rewind %q: driver %q: %w", req.Machine, mg.Driver.Name(), ErrUnsupported)
	}
	starter, ok := mg.Driver.(InPlaceStarter)
	if !ok {
		return nil, fmt.Errorf("rewind %q: not supported by the %s driver: %w", req.Machine, mg.Driver.Name(), ErrUnsupported)
	}
	if err := ValidateName(req.Machine); err != nil {
		return nil, fmt.Errorf("rewind: %w", err)
	}
	if err := req.Identity.ValidateFor(1); err != nil {
		return nil, fmt.Errorf("rewind %q: %w", req.Machine, err)
	}
	if err := ValidateName(req.To); err != nil {
		return nil, fmt.Errorf("rewind %q: template: %w", req.Machine, err)
	}
	if err := l.take(ctx, req.To); err != nil {
		return nil, fmt.Errorf("rewind %q: template %q: %w", req.Machine, req.To, err)
	}
	t, err := mg.Store.FindKept(req.To)
	if err != nil {
		return nil, fmt.Errorf("rewind %q: %w", req.Machine, err)
	}
	if err := l.take(ctx, req.Machine); err != nil {
		return nil, fmt.Errorf("rewind %q: %w", req.Machine, err)
	}
	m, err := mg.Get(ctx, req.Machine)
	if err != nil {
		return nil, fmt.Errorf("rewind: %w", err)
	}
	if err := mg.checkRewind(ctx, m, t, req.Force); err != nil {
		return nil, fmt.Errorf("rewind %q to %q: %w", m.Name, req.To, err)
	}
	opts := req.Identity
	if t.Source == m.Name {
		// The checkpoint's hostname, machine-id and host keys are this
		// machine's own; the clock, the RNG (vmgenid) and the lease are
		// renewed.
		opts.Spec.Skip = append(slices.Clone(opts.Spec.Skip), customize.StepHostname, customize.StepMachineID, customize.StepSSHHostKeys)
	}
	return &rewindPlan{req: req, starter: starter, m: m, t: t, opts: opts}, nil
}

// Rewind replaces req.Machine's QEMU by a fork of kept template req.To
// that takes the machine's place. Everything that can be checked is checked
// before the machine's process is ended (planRewind); if the new process
// then fails to come up, the machine is left stopped on its old disk and
// the error says so.
func (mg *Manager) Rewind(ctx context.Context, req RewindRequest) (*ChildResult, error) {
	mg.recoverFirst(ctx)
	l := mg.locks()
	defer l.release()
	p, err := mg.planRewind(ctx, req, l)
	if err != nil {
		return nil, err
	}
	return mg.applyRewind(ctx, p)
}

// PlanRewind checks a rewind as Rewind does and says what it would do.
func (mg *Manager) PlanRewind(ctx context.Context, req RewindRequest) (*Plan, error) {
	return dryRun(mg.planRewind(ctx, req, noLocks()))
}

func (p *rewindPlan) render() *Plan {
	m, t := p.m, p.t
	out := &Plan{Command: "rewind", Changed: true, Source: t.Name, Template: t.Name, Machines: []string{m.Name}}
	if m.State == StateRunning {
		out.add("end machine %q's QEMU (pid %d)", m.Name, m.PID)
	}
	out.add("start machine %q from kept template %q (%s) in place, with its name, guest MAC and host ports", m.Name, t.Name, t.ID)
	if t.Source == m.Name {
		out.add("renew its clock, RNG and lease; its hostname, machine-id and SSH host keys stay the checkpoint's, its own")
	} else {
		out.add("give it its name as hostname and a fresh machine-id and SSH host keys (a checkpoint of %q)", t.Source)
	}
	return out
}

// applyRewind carries out plan p; the caller holds its locks.
func (mg *Manager) applyRewind(ctx context.Context, p *rewindPlan) (*ChildResult, error) {
	m, t, req, opts := p.m, p.t, p.req, p.opts
	old := *m
	old.State, old.PID = StateStopped, 0
	// A rewind cut short is undone by the next command: the machine is
	// put back as the error path below leaves it (repairRewind).
	done, err := mg.Store.journal(journalEntry{Op: opRewind, Source: m.Name, Template: t.ID, Prior: &old})
	if err != nil {
		return nil, fmt.Errorf("rewind %q: %w", m.Name, err)
	}
	defer done()
	if m.State == StateRunning {
		if err := mg.Driver.Stop(ctx, m, true); err != nil {
			return nil, fmt.Errorf("rewind %q: stop the machine: %w", m.Name, err)
		}
	}
	restore := func(err error) (*ChildResult, error) {
		mg.detachLedger(ctx, m) // stopped, whatever new QEMU there was too
		if serr := mg.Store.SaveMachine(&old); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, fmt.Errorf("rewind %q to %q: %w (the machine is stopped on its disk from before the rewind)", m.Name, req.To, err)
	}
	if err := mg.Store.SaveMachine(&old); err != nil {
		return restore(err)
	}
	c, err := mg.rewoundMachine(ctx, &old, t, opts)
	if err != nil {
		return restore(err)
	}
	log := mg.Log.WithFields(logrus.Fields{"machine": c.Name, "template": t.ID})
	dropDisk := func() {
		if c.Paths.Disk != "" && c.Paths.Disk != old.Paths.Disk {
			os.Remove(c.Paths.Disk)
		}
		dropNewDisks(c, &old)
	}
	if err := p.starter.StartInPlace(ctx, c, t); err != nil {
		dropDisk()
		return restore(err)
	}
	res := ChildResult{Name: c.Name, PID: c.PID, Ports: c.Spec.Ports}
	// The same name and socket: the server reconnects to the new QEMU;
	// the ledger sees the same machine, its claims its own (yours).
	mg.attachLedger(ctx, c)
	Fault(FaultRewindRunning, c.PID)
	id, err := mg.applyIdentity(ctx, c, t, 1, true, opts)
	res.Identity = id
	if err != nil {
		mg.Driver.Stop(context.WithoutCancel(ctx), c, true)
		dropDisk()
		return restore(fmt.Errorf("identity: %w", err))
	}
	c.State, res.State = StateRunning, StateRunning
	if err := mg.Store.SaveMachine(c); err != nil {
		return &res, err
	}
	if c.Paths.Disk != "" {
		overlay.RemoveOldTops(c.Paths.Dir, c.Paths.Disk)
	}
	RemoveOldDiskTops(c)
	log.Info("machine rewound")
	mg.collectTemplates(ctx)
	return &res, nil
}

// checkRewind refuses what would fail or surprise, before m is touched.
func (mg *Manager) checkRewind(ctx context.Context, m *Machine, t *Template, force bool) error {
	if m.Driver != mg.Driver.Name() {
		return fmt.Errorf("machine belongs to driver %q: %w", m.Driver, ErrInvalid)
	}
	if m.State != StateRunning && m.State != StateStopped {
		return fmt.Errorf("machine is %s: %w", m.State, ErrInvalid)
	}
	if m.Adopted != nil {
		return fmt.Errorf("an adopted machine's own definition is not vmfork's to replace: %w", ErrUnsupported)
	}
	if !t.HasMemory {
		return fmt.Errorf("template %s holds only a disk (a stopped machine's); a rewind needs an instant with memory: %w", t.ID, ErrInvalid)
	}
	if t.Source != m.Name && !force {
		return fmt.Errorf("template %s is a checkpoint of machine %q, not of %q (--force takes it anyway, with a fresh machine-id and host keys): %w", t.ID, t.Source, m.Name, ErrInvalid)
	}
	if (t.Spec.Disk == "") != (m.Spec.Disk == "") {
		return fmt.Errorf("the template and the machine differ in having a disk: %w", ErrInvalid)
	}
	return mg.CheckTemplate(ctx, t)
}

// rewoundMachine is machine m's record as a child of t (inPlaceChild), with
// the identity the rewind gives it and m's guest MAC.
func (mg *Manager) rewoundMachine(ctx context.Context, m *Machine, t *Template, opts IdentityOptions) (*Machine, error) {
	return mg.inPlaceChild(ctx, m, t, func(c *Machine) error {
		if err := mg.prepareIdentity(c, t, 1, opts); err != nil {
			return err
		}
		c.GuestMAC = m.GuestMAC
		return nil
	})
}

// inPlaceChild is machine m's record as a child of t that takes m's place
// (rewind, resume), saved in state creating: m's name, files, host ports,
// guest MAC and lineage, t's device configuration (its network too: the
// NIC's kind is in the device state), RAM and a new disk overlay on t's
// frozen disk (a new name: QEMU reopens images by name). Its Template is t
// from now on, so t counts as used while the new process starts. prep sets
// what differs between the callers before the record is saved. On error no
// new disk is left.
func (mg *Manager) inPlaceChild(ctx context.Context, m *Machine, t *Template, prep func(c *Machine) error) (*Machine, error) {
	c := *m
	c.State, c.PID, c.Accel = StateCreating, 0, t.Accel
	c.Spec = t.Spec
	c.Spec.Ports = slices.Clone(m.Spec.Ports)
	c.Template = t.ID
	c.Paths.RAM, c.Paths.RAMShared = t.MappedRAM(), false
	if err := prep(&c); err != nil {
		return nil, err
	}
	if c.GuestMAC == "" {
		c.GuestMAC = m.Spec.MAC
	}
	if t.Paths.Disk != "" {
		next, err := overlay.NextTop(m.Paths.Dir)
		if err != nil {
			return nil, err
		}
		if err := overlay.Create(ctx, t.Paths.Disk, next); err != nil {
			return nil, err
		}
		c.Paths.Disk = next
	}
	made, err := inPlaceDisks(ctx, m, t, &c)
	if err == nil {
		err = mg.Store.SaveMachine(&c)
	}
	if err != nil {
		if c.Paths.Disk != m.Paths.Disk {
			os.Remove(c.Paths.Disk)
		}
		for _, f := range made {
			os.Remove(f)
		}
		return nil, err
	}
	return &c, nil
}

// repairRewind undoes a rewind whose vmfork process died before it
// finished (journal.go): the new process, if any, is killed and the
// machine is left stopped on its disk from before the rewind, as a rewind
// that fails leaves it. The identity options of the dead command are not
// on disk, so the rewind is not finished. A rewind that had finished only
// loses the disks it had replaced.
func (mg *Manager) repairRewind(ctx context.Context, e journalEntry) (done bool, err error) {
	unlock, err := mg.tryLock(ctx, e.Source)
	if err != nil {
		return false, nil
	}
	defer unlock()
	defer mg.Store.removeTempFiles(e.Template)
	m, err := mg.Store.LoadMachine(e.Source)
	if err != nil || m.Driver != mg.Driver.Name() || e.Prior == nil || !m.Created.Equal(e.Prior.Created) {
		return true, nil // removed since, or a new machine of that name
	}
	switch {
	case m.State == StateRunning && m.Template == e.Template:
		// Finished; killed before the old tops were removed.
	case m.State == StateStopped && m.Paths.Disk == e.Prior.Paths.Disk:
		// Killed before the new record was saved: stopped, as it is.
	default:
		if err := mg.stopAll(ctx, m); err != nil {
			return false, fmt.Errorf("repair %q after an interrupted rewind: %w", m.Name, err)
		}
		m = e.Prior
		if err := mg.Store.SaveMachine(m); err != nil {
			return false, fmt.Errorf("repair %q after an interrupted rewind: %w", m.Name, err)
		}
		mg.Log.WithField("machine", m.Name).Warn("a machine whose rewind was interrupted is stopped on its disk from before")
	}
	if m.Paths.Disk != "" {
		overlay.RemoveOldTops(m.Paths.Dir, m.Paths.Disk)
	}
	RemoveOldDiskTops(m)
	return true, nil
}
