package vmfork

import (
	"context"
	"fmt"
)

// IdentityOptions say how fork children get identities of their own. The
// zero value is the default: a fresh identity through the default chain.
type IdentityOptions struct {
	// KeepOnFailure keeps a child whose identity chain failed, with its
	// network link down, instead of killing it.
	KeepOnFailure bool
}

// Validate checks the options before anything is paused.
func (o IdentityOptions) Validate() error { return nil }

// IdentityResult is what the identity chain did in one child.
type IdentityResult struct{}

// preFork runs the source's pre-fork hooks before it is frozen.
func (mg *Manager) preFork(ctx context.Context, src *Machine, opts IdentityOptions) error {
	return nil
}

// prepareIdentity sets what a child's identity needs before its QEMU starts.
func (mg *Manager) prepareIdentity(c *Machine, tpl *Template, index int, opts IdentityOptions) error {
	return nil
}

// applyIdentity gives running child c its identity and lets it onto the
// network. A live child starts with its NIC link down (the driver sees to
// that); the link goes up only once the chain has finished.
func (mg *Manager) applyIdentity(ctx context.Context, c *Machine, tpl *Template, index int, live bool, opts IdentityOptions) (*IdentityResult, error) {
	if err := mg.waitAgent(ctx, c); err != nil {
		return nil, err
	}
	if !live {
		return nil, nil
	}
	ls, ok := mg.Driver.(LinkSetter)
	if !ok {
		return nil, fmt.Errorf("driver %q cannot set a NIC link: %w", mg.Driver.Name(), ErrUnsupported)
	}
	return nil, ls.SetLink(ctx, c, true)
}

// LinkSetter is the optional driver capability to switch a machine's NIC
// link, which keeps a fork child off the network until it has its identity.
type LinkSetter interface {
	SetLink(ctx context.Context, m *Machine, up bool) error
}
