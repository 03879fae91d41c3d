package vmfork

import (
	"context"

	"github.com/vmfork/vmfork/qmp"
)

// Driver runs machines on one kind of host. Keep it small: optional
// capabilities live in their own interfaces (Forker), found by type
// assertion.
type Driver interface {
	// Name is the driver's name in records and messages, e.g. "qemu".
	Name() string

	// Start starts machine m from its record and returns once its guest
	// agent answers. It fills in m.PID, m.Accel and the Spec fields it
	// resolves. On error no process of m is left running and the error
	// carries the tail of QEMU's log. Not idempotent: m must not be running.
	Start(ctx context.Context, m *Machine) error

	// Stop shuts m down: politely first, then by force; with force it kills
	// at once. Idempotent: stopping a stopped machine returns nil.
	Stop(ctx context.Context, m *Machine, force bool) error

	// Status reports m's actual state; the record may be stale because a
	// QEMU process can exit on its own. It does not change the record.
	Status(ctx context.Context, m *Machine) (State, error)

	// Agent connects to m's guest agent. The caller closes it.
	Agent(ctx context.Context, m *Machine) (*qmp.Agent, error)
}
