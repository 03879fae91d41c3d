package vmfork

import (
	"context"
	"fmt"
	"io"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/customize"
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
	// Broker serves brokered secrets (brokered.go); nil refuses every
	// contract with secrets.
	Broker SecretBroker
	// Ledger is the family ledger (ledger.go) every machine's ledger port
	// is registered with while its QEMU runs; nil leaves the ports
	// unanswered.
	Ledger FamilyLedger
	// Host is what admission reads of the host (admission.go); nil: this
	// machine's /proc and file systems.
	Host HostProbe
	// Admission is the admission policy (--overcommit).
	Admission AdmissionPolicy
	// hostKeys makes the SSH host keys of this Manager's fork children.
	// Their types are in the template's facts, so each child's keys are
	// started before its QEMU (preFork starts the first's earlier still).
	hostKeys customize.KeyMaker
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
	recorded := m.State
	m.State = st
	if st == StateStopped {
		m.PID = 0
		m.StopReason = mg.stopReason(m, recorded)
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
