package qemudrv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
)

// detachTimeout bounds the wait for the guest to release one unplugged
// device (PCIe hot-unplug: the guest's driver lets go, then the slot powers
// off; Linux's pciehp alone waits 5 s, more under TCG).
const detachTimeout = 90 * time.Second

// detachDevices is the first step of a freeze: when QEMU refuses to migrate
// the source (query-migrate blocked-reasons), it refuses the fork in one line
// that names the extra devices, or, when the fork asked for it
// (detach: fork --detach-devices), unplugs them all, waits until the guest has released
// each, deletes the objects only they used, and checks that nothing blocks
// any more. The source's record and the template's spec then have the
// devices detached, so the manifest and the children have none of them.
// replug makes the objects and plugs the devices back into the source with
// the same arguments, after the freeze whatever its outcome; a device it
// cannot plug back stays detached in the source's record, with a warning.
func (d *Driver) detachDevices(ctx context.Context, mon *qmp.Monitor, src *vmfork.Machine, t *vmfork.Template, detach bool) (replug func(context.Context), err error) {
	replug = func(context.Context) {}
	reasons, err := blockedReasons(ctx, mon)
	if err != nil || len(reasons) == 0 {
		return replug, err
	}
	plugged := src.Spec.Plugged()
	if !detach || len(plugged) == 0 {
		hint := ""
		if len(plugged) > 0 {
			var names []string
			for _, dev := range plugged {
				names = append(names, fmt.Sprintf("%s (%s)", dev.ID(), dev.Driver()))
			}
			hint = "; device " + strings.Join(names, ", device ") + " can be unplugged for the fork with --detach-devices"
		}
		return replug, fmt.Errorf("%w: %s%s: %w", qemustate.ErrMigrationBlocked, strings.Join(reasons, "; "), hint, vmfork.ErrUnsupported)
	}
	// Both specs get copies: they share the slice with each other.
	src.Spec.Devices = slices.Clone(src.Spec.Devices)
	t.Spec.Devices = slices.Clone(src.Spec.Devices)
	var unplugged []int
	var objects []string // deleted with their devices, in order
	replug = func(ctx context.Context) {
		// Not under the caller's ctx alone: the devices go back also after
		// a cancel.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), detachTimeout)
		defer cancel()
		for _, o := range objects {
			if err := hmp(rctx, mon, "object_add "+o); err != nil {
				d.log.WithField("machine", src.Name).WithError(err).Warnf("object %s not made again", vmfork.ObjectID(o))
			}
		}
		for _, i := range unplugged {
			dev := &src.Spec.Devices[i]
			if err := hmp(rctx, mon, "device_add "+dev.Arg); err != nil {
				d.log.WithField("machine", src.Name).WithError(err).Warnf("device %s stays unplugged", dev.ID())
				continue
			}
			dev.Detached = false
		}
	}
	for i, dev := range src.Spec.Devices {
		if dev.Detached {
			continue
		}
		if err := unplug(ctx, mon, dev.ID()); err != nil {
			replug(ctx)
			return func(context.Context) {}, fmt.Errorf("detach device %s: %w", dev.ID(), err)
		}
		unplugged = append(unplugged, i)
		src.Spec.Devices[i].Detached, t.Spec.Devices[i].Detached = true, true
	}
	// The backends only the unplugged devices used go too: see
	// Spec.ActiveObjects.
	active := map[string]bool{}
	for _, o := range src.Spec.ActiveObjects() {
		active[o] = true
	}
	for _, o := range src.Spec.Objects {
		if active[o] {
			continue
		}
		if err = mon.Execute(ctx, "object-del", map[string]any{"id": vmfork.ObjectID(o)}, nil); err != nil {
			replug(ctx)
			return func(context.Context) {}, fmt.Errorf("delete object %s of a detached device: %w", vmfork.ObjectID(o), err)
		}
		objects = append(objects, o)
	}
	if err := ramBlocksGone(ctx, mon, objects); err != nil {
		replug(ctx)
		return func(context.Context) {}, err
	}
	if reasons, err = blockedReasons(ctx, mon); err == nil && len(reasons) > 0 {
		err = fmt.Errorf("%w with its devices detached: %s: %w", qemustate.ErrMigrationBlocked, strings.Join(reasons, "; "), vmfork.ErrUnsupported)
	}
	if err != nil {
		replug(ctx)
		return func(context.Context) {}, err
	}
	d.log.WithField("machine", src.Name).WithField("devices", len(unplugged)).Info("devices detached for the fork")
	return replug, nil
}

// ramBlocksGone waits (bounded) until no RAM block of the deleted objects is
// left. QEMU frees a deleted memory backend's block only once the last
// reference to its memory region is dropped, some of them in RCU callbacks
// after object-del returned: a save in between would still list the block
// (as "<device path>/<id>"), and no child, started without it, could load
// the state ("Unknown ramblock"). Seen under load, one fork in a few.
func ramBlocksGone(ctx context.Context, mon *qmp.Monitor, objects []string) error {
	if len(objects) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, detachTimeout)
	defer cancel()
	for {
		blocks, err := qemustate.NonRAMBlocks(ctx, mon, ramID)
		if err != nil {
			return fmt.Errorf("detach devices: %w", err)
		}
		left := ""
		for _, o := range objects {
			if b := qemustate.BlockOf(blocks, vmfork.ObjectID(o)); b != "" {
				left = b
			}
		}
		if left == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("detach devices: QEMU still has RAM block %s of a deleted object after %v", left, detachTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func blockedReasons(ctx context.Context, mon *qmp.Monitor) ([]string, error) {
	var info qemustate.MigrationInfo
	if err := mon.Execute(ctx, qemustate.CmdQueryMigrate, nil, &info); err != nil {
		return nil, fmt.Errorf("query migration: %w", err)
	}
	return info.BlockedReasons, nil
}

// unplug asks QEMU to unplug device id and waits for DEVICE_DELETED, which
// comes once the guest has released it.
func unplug(ctx context.Context, mon *qmp.Monitor, id string) error {
	ctx, cancel := context.WithTimeout(ctx, detachTimeout)
	defer cancel()
	events, err := mon.Events(ctx) // before device_del, or the event may come first
	if err != nil {
		return err
	}
	if err := mon.Execute(ctx, "device_del", map[string]any{"id": id}, nil); err != nil {
		return err
	}
	for {
		ev, err := qmp.WaitEvent(ctx, events, qmp.EventDeviceDeleted)
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("the guest did not release it within %v", detachTimeout)
		}
		if err != nil {
			return err
		}
		var data struct {
			Device string `json:"device"`
		}
		if json.Unmarshal(ev.Data, &data) == nil && data.Device == id {
			return nil
		}
	}
}

// hmp runs a human-monitor command, which takes device_add's -device syntax
// as it is; it reports errors as output, not as a QMP error.
func hmp(ctx context.Context, mon *qmp.Monitor, line string) error {
	var out string
	if err := mon.Execute(ctx, "human-monitor-command", map[string]any{"command-line": line}, &out); err != nil {
		return err
	}
	if out = strings.TrimSpace(out); out != "" {
		return fmt.Errorf("%s: %s", line, out)
	}
	return nil
}
