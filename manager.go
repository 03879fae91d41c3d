package vmfork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/qmp"
)

// Manager carries out vmfork's verbs on one store with one driver.
type Manager struct {
	Store  *Store
	Driver Driver
	Log    *logrus.Entry
	// Reaper starts the process that enforces TTLs (ttl.go) when none runs;
	// nil leaves expired machines to vmfork gc.
	Reaper ReaperStarter
}

// NewManager returns a Manager. A nil log discards messages.
func NewManager(store *Store, driver Driver, log *logrus.Entry) *Manager {
	if log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		log = logrus.NewEntry(l)
	}
	return &Manager{Store: store, Driver: driver, Log: log}
}

// Boot creates machine name from spec and starts it. It returns once the
// guest agent answers. Bad input (name, spec, files, a name already taken) is
// rejected before anything is created; if QEMU fails, the machine's record
// and files are removed again.
func (mg *Manager) Boot(ctx context.Context, name string, spec Spec) (m *Machine, err error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	if err := mg.Recover(ctx); err != nil {
		mg.Log.WithError(err).Warn("repairing an interrupted command failed")
	}
	unlock, err := mg.Store.Lock(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	defer unlock()
	m = &Machine{
		Name:    name,
		Driver:  mg.Driver.Name(),
		State:   StateCreating,
		Spec:    spec,
		Paths:   mg.Store.MachinePaths(name),
		Created: time.Now().UTC(),
	}
	done, err := mg.Store.journal(journalEntry{Op: "boot", Machines: []string{name}})
	if err != nil {
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	defer done()
	if err := mg.Store.CreateMachine(m); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	log := mg.Log.WithField("machine", name)
	log.Info("booting")
	start := time.Now()
	if err := mg.Driver.Start(ctx, m); err != nil {
		if rerr := mg.Store.RemoveMachine(name); rerr != nil {
			log.WithError(rerr).Warn("could not remove the failed machine's files")
		}
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	m.State = StateRunning
	if err := mg.Store.SaveMachine(m); err != nil {
		return nil, fmt.Errorf("boot %q: %w", name, err)
	}
	log.WithField("elapsed", time.Since(start).Round(time.Millisecond)).Info("guest agent answers")
	return m, nil
}

// Get returns machine name's record with its state refreshed from the driver.
func (mg *Manager) Get(ctx context.Context, name string) (*Machine, error) {
	m, err := mg.Store.LoadMachine(name)
	if err != nil {
		return nil, err
	}
	mg.refresh(ctx, m)
	return m, nil
}

// List returns every machine with its state refreshed from the driver.
func (mg *Manager) List(ctx context.Context) ([]*Machine, error) {
	if err := mg.Recover(ctx); err != nil {
		mg.Log.WithError(err).Warn("repairing an interrupted fork failed")
	}
	ms, err := mg.Store.ListMachines()
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		// A listing whose states are only what the records last said
		// would look right and be wrong: a driver that cannot tell (a
		// libvirtd that stopped answering) fails it, naming the call.
		if err := mg.refreshState(ctx, m); err != nil {
			return nil, fmt.Errorf("machine %q: state: %w", m.Name, err)
		}
	}
	return ms, nil
}

// refresh replaces m.State with what the driver sees, for machines of this
// manager's driver. A machine whose QEMU exited on its own shows as stopped.
// When the driver cannot tell, m keeps its recorded state: the command
// then meets the driver's error itself, in its own words.
func (mg *Manager) refresh(ctx context.Context, m *Machine) {
	if err := mg.refreshState(ctx, m); err != nil {
		mg.Log.WithField("machine", m.Name).WithError(err).Debug("state unknown")
	}
}

// refreshState is refresh that returns the driver's error instead.
func (mg *Manager) refreshState(ctx context.Context, m *Machine) error {
	if m.Driver != mg.Driver.Name() || m.State == StateCreating || m.State == StateHibernated {
		return nil // a hibernated machine has no process to ask about
	}
	st, err := mg.Driver.Status(ctx, m)
	if err != nil {
		return err
	}
	m.State = st
	if st == StateStopped {
		m.PID = 0
	}
	return nil
}

// running loads machine name and checks that it runs.
func (mg *Manager) running(ctx context.Context, name string) (*Machine, error) {
	m, err := mg.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	if m.State != StateRunning {
		return nil, fmt.Errorf("machine %q is %s: %w", name, m.State, ErrNotRunning)
	}
	return m, nil
}

// ExecRequest is a command to run in a guest.
type ExecRequest struct {
	Argv  []string
	Env   []string
	Stdin []byte
}

// Exec runs a command in machine name through its guest agent and returns its
// exit status and output once it has exited.
func (mg *Manager) Exec(ctx context.Context, name string, req ExecRequest) (qmp.ExecStatus, error) {
	if len(req.Argv) == 0 {
		return qmp.ExecStatus{}, fmt.Errorf("exec %q: no command given: %w", name, ErrInvalid)
	}
	m, err := mg.running(ctx, name)
	if err != nil {
		return qmp.ExecStatus{}, fmt.Errorf("exec: %w", err)
	}
	agent, err := mg.Driver.Agent(ctx, m)
	if err != nil {
		return qmp.ExecStatus{}, fmt.Errorf("exec %q: %w", name, err)
	}
	defer agent.Close()
	st, err := agent.Run(ctx, qmp.ExecRequest{
		Path:          req.Argv[0],
		Args:          req.Argv[1:],
		Env:           req.Env,
		Input:         req.Stdin,
		CaptureOutput: true,
	})
	if err != nil {
		return st, fmt.Errorf("exec %q: %s: %w", name, req.Argv[0], err)
	}
	return st, nil
}

// Stop shuts machine name down and records it as stopped. Stopping a stopped
// machine is no error.
func (mg *Manager) Stop(ctx context.Context, name string, force bool) (*Machine, error) {
	unlock, err := mg.Store.Lock(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stop: %w", err)
	}
	defer unlock()
	m, err := mg.Store.LoadMachine(name)
	if err != nil {
		return nil, fmt.Errorf("stop: %w", err)
	}
	if m.State == StateHibernated {
		// Stopping would throw its RAM away: that is what rm is for.
		return nil, fmt.Errorf("stop %q: machine is hibernated (vmfork resume or vmfork rm it): %w", name, ErrInvalid)
	}
	if err := mg.stopLocked(ctx, m, force); err != nil {
		return nil, err
	}
	return m, nil
}

func (mg *Manager) stopLocked(ctx context.Context, m *Machine, force bool) error {
	if m.Driver != mg.Driver.Name() {
		return fmt.Errorf("stop %q: machine belongs to driver %q, not %q: %w", m.Name, m.Driver, mg.Driver.Name(), ErrInvalid)
	}
	if err := mg.Driver.Stop(ctx, m, force); err != nil {
		return fmt.Errorf("stop %q: %w", m.Name, err)
	}
	m.State, m.PID = StateStopped, 0
	if err := mg.Store.SaveMachine(m); err != nil {
		return fmt.Errorf("stop %q: %w", m.Name, err)
	}
	mg.Log.WithField("machine", m.Name).Info("stopped")
	return nil
}

// Remove kills machine name's QEMU if it runs and deletes its record and
// files. There is nothing to shut down cleanly: the disk goes too. With force
// the files are removed even when the process cannot be stopped. An adopted
// machine is not vmfork's to kill: it is forgotten and runs on (adopt.go).
func (mg *Manager) Remove(ctx context.Context, name string, force bool) error {
	if err := mg.Recover(ctx); err != nil {
		mg.Log.WithError(err).Warn("repairing an interrupted command failed")
	}
	unlock, err := mg.Store.Lock(ctx, name)
	if err != nil {
		return fmt.Errorf("rm: %w", err)
	}
	defer unlock()
	m, err := mg.Store.LoadMachine(name)
	if err != nil {
		return fmt.Errorf("rm: %w", err)
	}
	if m.Adopted != nil {
		if err := mg.forget(ctx, m); err != nil {
			return fmt.Errorf("rm: %w", err)
		}
		mg.collectTemplates(ctx)
		return nil
	}
	// A removal cut short is finished by the next command (journal.go).
	done, err := mg.Store.journal(journalEntry{Op: "rm", Machines: []string{name}})
	if err != nil {
		return fmt.Errorf("rm %q: %w", name, err)
	}
	defer done()
	if err := mg.stopLocked(ctx, m, true); err != nil {
		if !force {
			return fmt.Errorf("rm: %w (use --force to remove it anyway)", err)
		}
		mg.Log.WithField("machine", name).WithError(err).Warn("removing despite stop failure")
	}
	Fault(FaultRmStopped, m.PID)
	if err := mg.Store.RemoveMachine(name); err != nil {
		return fmt.Errorf("rm: %w", err)
	}
	mg.Log.WithField("machine", name).Info("removed")
	mg.collectTemplates(ctx)
	return nil
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
	if m.Driver != mg.Driver.Name() || m.Template == "" || (m.State != StateRunning && m.State != StatePaused) {
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
