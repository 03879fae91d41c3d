package qemudrv

import (
	"context"
	"fmt"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/sharedmem"
)

var _ vmfork.DiskForker = (*Driver)(nil)

// SwitchDisks implements vmfork.DiskForker: the disk switch of a live
// freeze (prepareDisks, then switchDisk's one transaction) with the vCPUs
// left running. The switch runs in a pause window whose pause and resume
// do nothing, so that a failed switch is undone by the same steps as in a
// live freeze.
func (d *Driver) SwitchDisks(ctx context.Context, src *vmfork.Machine, t *vmfork.Template) (err error) {
	if err := d.checkFreeze(src); err != nil {
		return err
	}
	if src.Spec.Disk == "" {
		return fmt.Errorf("machine %q has no disk to switch: %w", src.Name, vmfork.ErrInvalid)
	}
	mon, err := qmp.Dial(ctx, src.Paths.QMP, qmp.WithLogger(d.log.WithField("machine", src.Name)))
	if err != nil {
		return fmt.Errorf("connect to QMP: %w", err)
	}
	defer mon.Close()
	p := &freezePrep{cleanup: func() {}}
	if err := d.prepareDisks(ctx, mon, src, t, p); err != nil {
		return err
	}
	defer p.cleanup()
	noop := func(context.Context) error { return nil }
	w, err := sharedmem.Pause(ctx, sharedmem.PauseSource{Pause: noop, Resume: noop, StillPaused: vmfork.ErrStillPaused})
	if err != nil {
		return err
	}
	defer w.Rollback(ctx, &err)
	if err := switchDisk(ctx, mon, src, t, p, w); err != nil {
		return fmt.Errorf("switch disks: %w", err)
	}
	_, err = w.Resume(ctx)
	return err
}
