package vmfork

import (
	"context"
	"errors"
	"fmt"
)

// stopPlan is a stop or rm of one machine, checked once.
type stopPlan struct {
	verb  string // "stop" or "rm"
	m     *Machine
	force bool
	// foreign: m belongs to another driver (rm --force removes its files
	// without stopping it).
	foreign bool
}

// planStop checks a stop of machine name, taking its lock in l.
func (mg *Manager) planStop(ctx context.Context, name string, force bool, l *lockSet) (*stopPlan, error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("stop: %w", err)
	}
	if err := l.take(ctx, name); err != nil {
		return nil, fmt.Errorf("stop: %w", err)
	}
	m, err := mg.Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stop: %w", err)
	}
	if m.State == StateHibernated {
		// Stopping would throw its RAM away: that is what rm is for.
		return nil, fmt.Errorf("stop %q: machine is hibernated (vmfork resume or vmfork rm it): %w", name, ErrInvalid)
	}
	if m.Driver != mg.Driver.Name() {
		return nil, fmt.Errorf("stop %q: machine belongs to driver %q, not %q: %w", m.Name, m.Driver, mg.Driver.Name(), ErrInvalid)
	}
	return &stopPlan{verb: "stop", m: m, force: force}, nil
}

// Stop shuts machine name down and records it as stopped. Stopping a stopped
// machine is no error.
func (mg *Manager) Stop(ctx context.Context, name string, force bool) (*Machine, error) {
	l := mg.locks()
	defer l.release()
	p, err := mg.planStop(ctx, name, force, l)
	if err != nil {
		return nil, err
	}
	if err := mg.stopLocked(ctx, p.m, force); err != nil {
		return nil, err
	}
	return p.m, nil
}

// PlanStop checks a stop of names as Stop does and says what it would do.
// Like stop it checks every name: errs[i] is names[i]'s error, or nil.
func (mg *Manager) PlanStop(ctx context.Context, names []string, force bool) (*Plan, []error) {
	return planEach("stop", names, func(name string) (*Plan, error) {
		return dryRun(mg.planStop(ctx, name, force, noLocks()))
	})
}

// planEach is the dry run of a command on several machines: one plan of
// every name's actions, and each name's error.
func planEach(command string, names []string, plan func(name string) (*Plan, error)) (*Plan, []error) {
	out := &Plan{DryRun: true, Command: command, Machines: []string{}, Actions: []string{}}
	errs := make([]error, len(names))
	for i, name := range names {
		p, err := plan(name)
		if err != nil {
			errs[i] = err
			continue
		}
		out.Actions = append(out.Actions, p.Actions...)
		out.Machines = append(out.Machines, p.Machines...)
		out.Changed = out.Changed || p.Changed
	}
	return out, errs
}

// stopLocked stops m, whose lock the caller holds, and records it stopped.
func (mg *Manager) stopLocked(ctx context.Context, m *Machine, force bool) error {
	// What a child made private outlives it: the next fork of its source
	// is admitted on it (admission.go).
	if m.State == StateRunning {
		mg.noteUsage(m)
	}
	if err := mg.Driver.Stop(ctx, m, force); err != nil {
		return fmt.Errorf("stop %q: %w", m.Name, err)
	}
	mg.detachLedger(ctx, m)
	if m.State != StateStopped || m.StopReason == "" {
		// One found stopped keeps the reason derived for it (its QEMU
		// died, the host restarted).
		m.StopReason = StopByUser
	}
	m.State, m.PID = StateStopped, 0
	if err := mg.Store.SaveMachine(m); err != nil {
		return fmt.Errorf("stop %q: %w", m.Name, err)
	}
	mg.Log.WithField("machine", m.Name).Info("stopped")
	return nil
}

// planRemove checks an rm of machine name, taking its lock in l.
func (mg *Manager) planRemove(ctx context.Context, name string, force bool, l *lockSet) (*stopPlan, error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("rm: %w", err)
	}
	if err := l.take(ctx, name); err != nil {
		return nil, fmt.Errorf("rm: %w", err)
	}
	m, err := mg.Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("rm: %w", err)
	}
	switch {
	case m.Adopted != nil:
		// Disown only inspects; it says what keeps the machine.
		a, ok := mg.Driver.(Adopter)
		if !ok || m.Driver != mg.Driver.Name() {
			return nil, fmt.Errorf("rm: forget %q: machine was adopted by driver %q, not %q: %w", name, m.Driver, mg.Driver.Name(), ErrInvalid)
		}
		if err := a.Disown(ctx, m); err != nil {
			return nil, fmt.Errorf("rm: forget %q: %w", name, err)
		}
	case m.Driver != mg.Driver.Name() && !force:
		return nil, fmt.Errorf("rm: stop %q: machine belongs to driver %q, not %q: %w (use --force to remove it anyway)", name, m.Driver, mg.Driver.Name(), ErrInvalid)
	}
	return &stopPlan{verb: "rm", m: m, force: force, foreign: m.Driver != mg.Driver.Name()}, nil
}

// Remove kills machine name's QEMU if it runs and deletes its record and
// files. There is nothing to shut down cleanly: the disk goes too. With force
// the files are removed even when the process cannot be stopped. An adopted
// machine is not vmfork's to kill: it is forgotten and runs on (adopt.go).
func (mg *Manager) Remove(ctx context.Context, name string, force bool) error {
	mg.recoverFirst(ctx)
	l := mg.locks()
	defer l.release()
	p, err := mg.planRemove(ctx, name, force, l)
	if err != nil {
		return err
	}
	return mg.applyRemove(ctx, p)
}

// PlanRemove checks an rm of names as Remove does and says what it would
// do. Like rm it checks every name: errs[i] is names[i]'s error, or nil.
func (mg *Manager) PlanRemove(ctx context.Context, names []string, force bool) (*Plan, []error) {
	return planEach("rm", names, func(name string) (*Plan, error) {
		return dryRun(mg.planRemove(ctx, name, force, noLocks()))
	})
}

func (p *stopPlan) render() *Plan {
	m := p.m
	out := &Plan{Command: p.verb, Changed: true, Machines: []string{m.Name}}
	if p.verb == "stop" {
		if m.State == StateStopped {
			out.Changed = false
			return out
		}
		how := "shut down"
		if p.force {
			how = "kill"
		}
		out.add("%s machine %q (pid %d) and record it stopped; its disk stays", how, m.Name, m.PID)
		return out
	}
	switch {
	case m.Adopted != nil:
		out.add("forget adopted machine %q; it runs on, as its owner's", m.Name)
	case p.foreign:
		out.add("delete machine %q of driver %q with its files, without stopping it (--force)", m.Name, m.Driver)
	case m.State == StateStopped:
		out.add("delete stopped machine %q with its disk overlay, record and logs", m.Name)
	case m.State == StateHibernated:
		out.add("delete hibernated machine %q with its disk overlay, record and logs; its RAM file on disk goes once no child of it maps it", m.Name)
	default:
		out.add("kill machine %q (pid %d) and delete it with its disk overlay, record, sockets, logs and RAM file", m.Name, m.PID)
	}
	return out
}

// applyRemove carries out plan p; the caller holds its lock.
func (mg *Manager) applyRemove(ctx context.Context, p *stopPlan) error {
	m, name := p.m, p.m.Name
	if m.Adopted != nil {
		if err := mg.forget(ctx, m); err != nil {
			return fmt.Errorf("rm: %w", err)
		}
		mg.collectTemplates(ctx)
		return nil
	}
	// A removal cut short is finished by the next command (journal.go).
	done, err := mg.Store.journal(journalEntry{Op: opRm, Machines: []string{name}})
	if err != nil {
		return fmt.Errorf("rm %q: %w", name, err)
	}
	defer done()
	if p.foreign {
		mg.Log.WithField("machine", name).Warn("removing a machine of another driver without stopping it (--force)")
		mg.detachLedger(ctx, m) // stopLocked detaches the others
	} else if err := mg.stopLocked(ctx, m, true); err != nil {
		if !p.force {
			return fmt.Errorf("rm: %w (use --force to remove it anyway)", err)
		}
		mg.Log.WithField("machine", name).WithError(err).Warn("removing despite stop failure")
		mg.detachLedger(ctx, m)
	}
	Fault(FaultRmStopped, m.PID)
	mg.unbroker(ctx, m)
	if err := mg.Store.RemoveMachine(name); err != nil {
		return fmt.Errorf("rm: %w", err)
	}
	mg.Log.WithField("machine", name).Info("removed")
	mg.collectTemplates(ctx)
	return nil
}

// repairRm finishes an rm whose vmfork process died (journal.go): the
// machine's process and files go, also what is left in the trash.
func (mg *Manager) repairRm(ctx context.Context, e journalEntry) (done bool, err error) {
	return mg.repairMachines(ctx, e)
}

// RemoveEnded removes fork child name, whose QEMU ended outside vmfork (a
// libvirt domain destroyed with virsh: the release hook asks for it), and its
// template with its last child. It acts only on a record of this driver
// that still says running or paused, read under the machine's lock, and only
// when the driver says it is stopped: a stop or removal through vmfork holds
// that lock while it ends the machine and records the outcome, so
// RemoveEnded then finds it stopped or gone and leaves it; a machine started
// again in the meantime runs on.
func (mg *Manager) RemoveEnded(ctx context.Context, name string) error {
	unlock, err := mg.Store.Lock(ctx, name)
	if err != nil {
		return fmt.Errorf("reap: %w", err)
	}
	m, err := mg.Store.LoadMachine(name)
	unlock()
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reap: %w", err)
	}
	// A child started again from its disk (start.go) has its own RAM: it
	// is a machine like a booted one, and stays, stopped.
	if m.Driver != mg.Driver.Name() || m.Template == "" || m.Paths.RAMShared || (m.State != StateRunning && m.State != StatePaused) {
		return nil
	}
	if st, err := mg.Driver.Status(ctx, m); err != nil || st != StateStopped {
		if err != nil {
			return fmt.Errorf("reap %q: %w", name, err)
		}
		return nil // a new QEMU of this machine runs
	}
	return mg.Remove(ctx, name, true)
}
