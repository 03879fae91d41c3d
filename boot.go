package vmfork

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/vmfork/vmfork/contract"
	"github.com/vmfork/vmfork/overlay"
)

// BootRequest asks for a new machine Name made of Spec.
type BootRequest struct {
	Name string
	Spec Spec
	// Contract is the machine's (contracts.go), which its children
	// inherit; nil for none.
	Contract *contract.Contract
}

// bootPlan is a boot checked once.
type bootPlan struct {
	req    BootRequest
	driver string
}

// planBoot checks a boot, taking the name's lock in l. Bad input (name,
// spec, files, a name already taken, a contract the driver cannot
// enforce) stops here.
func (mg *Manager) planBoot(ctx context.Context, req BootRequest, l *lockSet) (*bootPlan, error) {
	name, spec := req.Name, req.Spec
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	if err := mg.checkDiskSupport(spec, nil, true); err != nil {
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	if err := mg.checkBlockDisksFree(spec); err != nil {
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	if err := l.take(ctx, name); err != nil {
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	if err := mg.Store.nameFree(name); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	if err := mg.checkContract(ctx, "boot", name, &Machine{Name: name, Spec: spec}, req.Contract); err != nil {
		return nil, err
	}
	return &bootPlan{req: req, driver: mg.Driver.Name()}, nil
}

// Boot creates machine name from spec and starts it. It returns once the
// guest agent answers. Bad input is rejected before anything is created
// (planBoot); if QEMU fails, the machine's record and files are removed
// again.
func (mg *Manager) Boot(ctx context.Context, req BootRequest) (m *Machine, err error) {
	mg.recoverFirst(ctx)
	l := mg.locks()
	defer l.release()
	p, err := mg.planBoot(ctx, req, l)
	if err != nil {
		return nil, err
	}
	return mg.applyBoot(ctx, p)
}

// PlanBoot checks a boot as Boot does and says what it would do.
func (mg *Manager) PlanBoot(ctx context.Context, req BootRequest) (*Plan, error) {
	return dryRun(mg.planBoot(ctx, req, noLocks()))
}

func (p *bootPlan) render() *Plan {
	r := p.req
	out := &Plan{Command: "boot", Changed: true, Machines: []string{r.Name}, Contract: r.Contract}
	out.add("create machine %q (%d MiB, %d CPUs) with driver %q and start it", r.Name, r.Spec.MemoryMiB, r.Spec.CPUs, p.driver)
	for _, d := range r.Spec.Disks {
		if overlay.IsBlockDevice(d.File) && d.Policy() != DiskShared {
			out.add("attach disk %q: block device %s, written in place until the first fork freezes it (then the read-only base of overlays in the state dir, until vmfork disk commit); its forks: %s", d.ID, d.File, d.Policy())
		} else if d.Policy() == DiskShared {
			out.add("attach disk %q: %s, read-only, shared as it is with every child", d.ID, d.File)
		} else {
			out.add("attach disk %q: an overlay on %s (never written); its forks: %s", d.ID, d.File, d.Policy())
		}
	}
	if r.Contract.Enforced() {
		out.add("%s", describeContract(r.Contract))
	}
	return out
}

// applyBoot carries out plan p; the caller holds its lock.
func (mg *Manager) applyBoot(ctx context.Context, p *bootPlan) (*Machine, error) {
	name := p.req.Name
	m := &Machine{
		Name:     name,
		Driver:   mg.Driver.Name(),
		State:    StateCreating,
		Spec:     p.req.Spec,
		Paths:    mg.Store.MachinePaths(name),
		Created:  time.Now().UTC(),
		Contract: p.req.Contract.Clone(),
		Family:   newFamily(),
	}
	// Every machine vmfork boots has the family ledger's port; a machine
	// made before it did keeps none, and so do its children (Spec.LedgerPort).
	m.Spec.LedgerPort = true
	done, err := mg.Store.journal(journalEntry{Op: opBoot, Machines: []string{name}})
	if err != nil {
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	defer done()
	if err := mg.Store.CreateMachine(m); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	// A new machine of an old name: what the old one's children made is
	// not what this one's will (admission.go).
	os.Remove(mg.Store.usagePath(name))
	log := mg.Log.WithField("machine", name)
	log.Info("booting")
	start := time.Now()
	brokered, err := mg.brokerSecrets(ctx, m, 0)
	if err == nil {
		if err = mg.Driver.Start(ctx, m); err == nil {
			brokered(ctx)
		}
	}
	if err != nil {
		mg.unbroker(context.WithoutCancel(ctx), m)
		if rerr := mg.Store.RemoveMachine(name); rerr != nil {
			log.WithError(rerr).Warn("could not remove the failed machine's files")
		}
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	m.State = StateRunning
	if err := mg.Store.SaveMachine(m); err != nil {
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	mg.attachLedger(ctx, m)
	log.WithField("elapsed", time.Since(start).Round(time.Millisecond)).Info("guest agent answers")
	return m, nil
}

// repairBoot removes the machine a boot whose vmfork process died left
// half-made (state creating); one whose agent had answered stays
// (journal.go).
func (mg *Manager) repairBoot(ctx context.Context, e journalEntry) (done bool, err error) {
	return mg.repairMachines(ctx, e)
}
