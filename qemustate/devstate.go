package qemustate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/qmp"
)

// The migration-stream sequences: save a paused VM's device state into a file and load it into a
// QEMU started with -incoming defer. The file travels as a descriptor passed with getfd and an
// "fd:name" URI (see the package documentation).

// ErrMigrationBlocked is wrapped by PrepareSave's error when QEMU refuses to migrate the VM now.
var ErrMigrationBlocked = errors.New("QEMU refuses to save this VM's state")

// cancelTimeout bounds migrate_cancel after the caller's ctx has ended.
const cancelTimeout = 10 * time.Second

// PrepareSave readies a running VM for SaveDeviceState, before it is paused. It returns an error
// wrapping ErrMigrationBlocked, with QEMU's reasons, when a device forbids migrating (one without
// migration support, such as a passed-through one; QEMU 6.0+ says so in query-migrate before any
// migration starts), and then sets x-ignore-shared.
func PrepareSave(ctx context.Context, ex qmp.Executor) error {
	info, err := queryMigrate(ctx, ex)
	if err != nil {
		return fmt.Errorf("query migration: %w", err)
	}
	if len(info.BlockedReasons) > 0 {
		return fmt.Errorf("%w: %s (detach such devices first)", ErrMigrationBlocked, strings.Join(info.BlockedReasons, "; "))
	}
	return SetIgnoreShared(ctx, ex)
}

// SetIgnoreShared sets x-ignore-shared, which a save and the load of its state both need.
func SetIgnoreShared(ctx context.Context, ex qmp.Executor) error {
	if err := setCapabilities(ctx, ex, []Capability{{Name: CapXIgnoreShared, State: true}}); err != nil {
		return fmt.Errorf("set %s: %w", CapXIgnoreShared, err)
	}
	return nil
}

// CreateSaveFile creates the device-state file at path, which must not exist yet, and passes it
// to QEMU under name, for SaveDeviceState. Done before the VM pauses, this keeps file creation out
// of the pause. release closes QEMU's copy of the descriptor; call it once the save is over
// (migrate took the descriptor then, and the closefd fails harmlessly) or did not happen.
func CreateSaveFile(ctx context.Context, ex qmp.Executor, name, path string) (release func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create device-state file: %w", err)
	}
	defer f.Close()
	if err := qmp.GetFD(ctx, ex, name, f); err != nil {
		return nil, fmt.Errorf("pass device-state file: %w", err)
	}
	return func() {
		// Not under the caller's ctx: release runs on the way out, also after a cancel.
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		qmp.CloseFD(cctx, ex, name)
	}, nil
}

// SaveDeviceState saves the paused VM's device state into the file QEMU holds under name
// (CreateSaveFile) and waits, polling every poll, until the save has completed. When ctx ends first
// it cancels the migration: QMP cancels nothing by itself, and a save that completed after the
// caller resumed the VM would stop it again (QEMU's "postmigrate"). log, when not nil, gets the
// migration's state changes and a failed cancel at debug level.
func SaveDeviceState(ctx context.Context, ex qmp.Executor, name string, poll time.Duration, log *logrus.Entry) error {
	if err := migrate(ctx, ex, CmdMigrate, "fd:"+name); err != nil {
		return err
	}
	_, err := WaitMigration(ctx, ex, poll, log)
	if err != nil && ctx.Err() != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
		defer cancel()
		if cerr := ex.Execute(cctx, CmdMigrateCancel, nil, nil); cerr != nil {
			orDiscard(log).WithError(cerr).Debug("qmp: migrate_cancel failed")
		}
	}
	return err
}

// LoadDeviceState passes the device-state file at path to QEMU under name, loads it into a QEMU
// started with -incoming defer, and waits, polling every poll, until the load has completed. The
// capabilities of the save (SetIgnoreShared) must be set first. Only then may the VM be resumed.
// log, when not nil, gets the load's state changes at debug level.
func LoadDeviceState(ctx context.Context, ex qmp.Executor, name, path string, poll time.Duration, log *logrus.Entry) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = qmp.GetFD(ctx, ex, name, f)
	f.Close()
	if err != nil {
		return err
	}
	if err := migrate(ctx, ex, CmdMigrateIncoming, "fd:"+name); err != nil {
		return err
	}
	_, err = WaitMigration(ctx, ex, poll, log)
	return err
}
