package vmfork

import (
	"context"
	"fmt"
)

// Adopter is the optional driver capability to take charge of a machine that
// vmfork did not make (an existing libvirt domain), so that it can be forked.
type Adopter interface {
	// Adopt inspects the machine called name and returns a record for it,
	// or an error naming what makes it unforkable. It changes nothing.
	Adopt(ctx context.Context, name string, paths Paths) (*Machine, error)
}

// adopt records a machine the driver found but vmfork did not make.
func (mg *Manager) adopt(ctx context.Context, a Adopter, name string) (*Machine, error) {
	m, err := a.Adopt(ctx, name, mg.Store.MachinePaths(name))
	if err != nil {
		return nil, fmt.Errorf("machine %q: %w", name, err)
	}
	if err := mg.Store.CreateMachine(m); err != nil {
		return nil, err
	}
	mg.Log.WithField("machine", name).Info("adopted")
	return m, nil
}
