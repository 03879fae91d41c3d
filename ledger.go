package vmfork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/vmfork/vmfork/ledger"
)

// The family ledger (package ledger, docs/LEDGER.md): every machine with a
// ledger port (Spec.LedgerPort) is registered with the ledger server
// whenever its QEMU starts, so that its guest's claims are answered with
// no vmfork command running, and unregistered when its QEMU stops or goes.
// The Manager reaches the ledger only through Manager.Ledger, which
// cmd/vmfork wires to a *ledger.Client; nil leaves every port unanswered.

// FamilyLedger is what the Manager asks of the family ledger:
// *ledger.Client is one.
type FamilyLedger interface {
	// Attach registers a running machine (idempotent), starting the
	// ledger server when none runs.
	Attach(ctx context.Context, m ledger.Machine) error
	// Detach unregisters a machine whose QEMU stopped or went (idempotent).
	Detach(ctx context.Context, name string) error
	// KeysOf returns the records machine holds or held in family.
	KeysOf(ctx context.Context, family, machine string) ([]ledger.Record, error)
	// ReleaseHeldBy releases the keys machine holds and has not done.
	ReleaseHeldBy(ctx context.Context, family, machine string) ([]ledger.Record, error)
}

// ledgerTimeout bounds one call to the ledger from a verb: a ledger that
// does not answer costs a fork at most this per child, never the fork.
const ledgerTimeout = 15 * time.Second

// ledgerMachine is m as the ledger knows it; ok is false for a machine
// without a ledger port.
func ledgerMachine(m *Machine) (lm ledger.Machine, ok bool) {
	sock := m.LedgerSocket()
	if sock == "" {
		return ledger.Machine{}, false
	}
	return ledger.Machine{Name: m.Name, Family: familyOf(m), Socket: sock}, true
}

// attachLedger registers machine m, whose QEMU has just started, with the
// family ledger. A failure does not fail the verb: the machine runs, only
// its ledger port goes unanswered (the guest helper says so after its
// timeout), so it is logged as a warning naming the machine.
func (mg *Manager) attachLedger(ctx context.Context, m *Machine) {
	lm, ok := ledgerMachine(m)
	if mg.Ledger == nil || !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerTimeout)
	defer cancel()
	if err := mg.Ledger.Attach(ctx, lm); err != nil {
		mg.Log.WithField("machine", m.Name).WithError(err).Warn("the family ledger's port of this machine will not answer until a ledger server serves it")
	}
}

// detachLedger unregisters machine m, whose QEMU stopped or went. A
// failure is logged only: the server drops a machine whose socket it
// cannot reach by itself (ledger.DropAfter).
func (mg *Manager) detachLedger(ctx context.Context, m *Machine) {
	if mg.Ledger == nil || m.LedgerSocket() == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerTimeout)
	defer cancel()
	if err := mg.Ledger.Detach(ctx, m.Name); err != nil {
		mg.Log.WithField("machine", m.Name).WithError(err).Debug("could not detach the machine from the family ledger")
	}
}

// LedgerMachines lists the machines of the store whose QEMU should be
// serving a ledger port now (recorded running, paused, or starting, with a
// socket on disk), with their families and sockets: what a ledger server
// that starts serves (ledger.ServerOptions.Discover). It reads records
// only, asks no driver and repairs nothing; a machine listed whose QEMU is
// gone is dropped by the server once its socket stays unreachable.
func (s *Store) LedgerMachines() ([]ledger.Machine, error) {
	ms, err := s.ListMachines()
	if err != nil {
		return nil, err
	}
	out := []ledger.Machine{}
	for _, m := range ms {
		switch m.State {
		case StateRunning, StatePaused, StateCreating:
		default:
			continue
		}
		lm, ok := ledgerMachine(m)
		if !ok {
			continue
		}
		if fi, err := os.Stat(lm.Socket); err != nil || fi.Mode().Type() != os.ModeSocket {
			continue
		}
		out = append(out, lm)
	}
	return out, nil
}

// FamilyOf returns the family id of machine name, or of the kept template
// name (vmfork ledger NAME); ErrNotFound when there is neither.
func (mg *Manager) FamilyOf(name string) (string, error) {
	if err := ValidateName(name); err != nil {
		return "", fmt.Errorf("ledger: %w", err)
	}
	m, err := mg.Store.LoadMachine(name)
	if err == nil {
		return familyOf(m), nil
	}
	if !errors.Is(err, ErrNotFound) {
		return "", fmt.Errorf("ledger: %w", err)
	}
	t, terr := mg.Store.FindKept(name)
	if terr != nil {
		return "", fmt.Errorf("ledger: no machine or kept template %q: %w", name, ErrNotFound)
	}
	if t.Family != "" {
		return t.Family, nil
	}
	// A template from before families: its source's (familyOf).
	return "m-" + t.Source, nil
}
