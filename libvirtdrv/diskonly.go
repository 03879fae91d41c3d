//go:build cgo

package libvirtdrv

import (
	"context"
	"fmt"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/sharedmem"
)

var _ vmfork.DiskForker = (*Driver)(nil)

// SwitchDisks implements vmfork.DiskForker (fork --disk-only): the disk
// switch of a live freeze (prepareDisk and prepareExtraDisks before it,
// switchDisk's one disk-only external snapshot) with the domain left
// running. libvirt 9.0 stops a domain's vCPUs for an external snapshot
// only when the snapshot takes its memory too
// (qemuSnapshotCreateActiveExternal); a disk-only one is one QMP
// transaction of blockdev-snapshot under running vCPUs. The guest agent's
// filesystem freeze around it is the Manager's (vmfork.freezeDiskOnly),
// through virDomainQemuAgentCommand, not libvirt's own quiesce flag
// (VIR_DOMAIN_SNAPSHOT_CREATE_QUIESCE): the Manager bounds the freeze,
// thaws on every error path and journals it, so that the repair of a
// vmfork killed in the window thaws the guest, as on the embedded driver.
// The switch runs in a pause window whose pause and resume do nothing, so
// that a failed switch is undone by the same steps as in a live freeze.
func (d *Driver) SwitchDisks(ctx context.Context, src *vmfork.Machine, t *vmfork.Template) (err error) {
	if src.Spec.Disk == "" {
		return fmt.Errorf("machine %q has no disk to switch: %w", src.Name, vmfork.ErrInvalid)
	}
	dom, err := d.domain(src)
	if err != nil {
		return err
	}
	if dom == nil {
		return fmt.Errorf("machine %q: %w", src.Name, vmfork.ErrNotRunning)
	}
	defer dom.Free()
	_, live, err := liveXML(ctx, dom, 0)
	if err != nil {
		return err
	}
	if err := checkSwitchable(live); err != nil {
		return err
	}
	if uid, gid, ok := parseDACLabel(dacLabel(live)); ok && qemuIsOther(uid, gid) {
		// As in prepareFreeze: QEMU must reach its new overlays.
		if err := grantSearch(stateDirOf(src.Paths.Dir), uid, gid, src.Paths.Dir, t.Paths.Dir); err != nil {
			return err
		}
	}
	p := &freezePrep{cleanup: func() {}}
	if err := prepareDisk(ctx, live, src, t, p); err != nil {
		return err
	}
	defer p.cleanup()
	if err := prepareExtraDisks(ctx, live, src, t, p); err != nil {
		return err
	}
	noop := func(context.Context) error { return nil }
	w, err := sharedmem.Pause(ctx, sharedmem.PauseSource{Pause: noop, Resume: noop, StillPaused: vmfork.ErrStillPaused})
	if err != nil {
		return err
	}
	defer w.Rollback(ctx, &err)
	if err := d.switchDisk(ctx, dom, src, t, p, w); err != nil {
		return fmt.Errorf("switch disks: %w", err)
	}
	d.log.WithField("machine", src.Name).WithField("snapshot_ms", p.snapshotMS).Debug("disks switched under running vCPUs")
	_, err = w.Resume(ctx)
	return err
}

// checkSwitchable is Check's disk part: the writable disks a disk-only
// fork switches must be files (checkDisks). Nothing of RAM or devices
// matters to it, since no device state is saved.
func checkSwitchable(live *libvirtxml.Domain) error {
	if live.Devices == nil {
		return nil
	}
	var ps []Problem
	checkDisks(live.Devices.Disks, func(el, why, fix string) { ps = append(ps, Problem{el, why, fix}) })
	if len(ps) == 0 {
		return nil
	}
	return &UnforkableError{Domain: live.Name, Problems: ps}
}
