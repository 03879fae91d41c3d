package vmfork

import (
	"context"
	"fmt"
)

// inspectAdoption asks the driver about name, a machine vmfork did not
// make, and returns the record its adoption would write. It changes
// nothing: a plan calls it, and the apply records it (recordAdoption).
func (mg *Manager) inspectAdoption(ctx context.Context, a Adopter, name string) (*Machine, error) {
	m, err := a.Adopt(ctx, name, mg.Store.MachinePaths(name))
	if err != nil {
		return nil, fmt.Errorf("machine %q: %w", name, err)
	}
	if m.Adopted == nil || m.Name != name {
		return nil, fmt.Errorf("machine %q: driver %q returned no adoption record", name, mg.Driver.Name())
	}
	m.Family = newFamily() // a root: vmfork did not make it from anything
	return m, nil
}

// recordAdoption records m, found by inspectAdoption.
func (mg *Manager) recordAdoption(m *Machine) error {
	if err := mg.Store.CreateMachine(m); err != nil {
		return err
	}
	mg.Log.WithField("machine", m.Name).Info("adopted")
	return nil
}

// forget removes adopted machine m's record and files and leaves the machine
// itself alone, running or not: it was its owner's before vmfork adopted it
// and stays theirs. It refuses while m still uses a file in the state dir,
// which removing would pull from under it. The caller holds m's lock.
func (mg *Manager) forget(ctx context.Context, m *Machine) error {
	a, ok := mg.Driver.(Adopter)
	if !ok || m.Driver != mg.Driver.Name() {
		return fmt.Errorf("forget %q: machine was adopted by driver %q, not %q: %w", m.Name, m.Driver, mg.Driver.Name(), ErrInvalid)
	}
	if err := a.Disown(ctx, m); err != nil {
		return fmt.Errorf("forget %q: %w", m.Name, err)
	}
	if err := mg.Store.RemoveMachine(m.Name); err != nil {
		return fmt.Errorf("forget %q: %w", m.Name, err)
	}
	mg.Log.WithField("machine", m.Name).Info("forgotten; the machine itself is left as it is")
	return nil
}

// forgetFailedAdoption forgets src, adopted for a fork that brought no child,
// so that a failed fork leaves no record behind. A fork that failed after it
// moved src onto an overlay in the state dir leaves src depending on vmfork:
// its record then stays, and vmfork rm says how to undo the move.
func (mg *Manager) forgetFailedAdoption(ctx context.Context, src *Machine) {
	ctx = context.WithoutCancel(ctx)
	if err := mg.forget(ctx, src); err != nil {
		mg.Log.WithField("machine", src.Name).WithError(err).Warn("the failed fork leaves the adopted machine recorded")
	}
}
