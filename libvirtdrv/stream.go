//go:build cgo

package libvirtdrv

import (
	"context"
	"fmt"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
)

var _ vmfork.LayerDropper = (*Driver)(nil)

// DropLayer implements vmfork.LayerDropper for a running machine: libvirt's
// block pull (virDomainBlockRebase, a QEMU block-stream) copies what the
// layer holds into the top image and makes the layer's own backing file the
// top's backing file, so the layer can be removed. libvirt runs the job and
// updates the domain's disk chain, so `virsh domblklist` stays true.
func (d *Driver) DropLayer(ctx context.Context, m *vmfork.Machine, layer string) error {
	dom, err := d.domain(m)
	if err != nil {
		return err
	}
	if dom == nil {
		return fmt.Errorf("machine %q: %w", m.Name, vmfork.ErrNotRunning)
	}
	defer dom.Free()
	chain, k, err := overlay.FindLayer(m.Paths.Disk, layer)
	if err != nil || k <= 0 {
		return err // nil when not below the top (any more)
	}
	_, live, err := liveXML(ctx, dom, 0)
	if err != nil {
		return err
	}
	disk := ""
	for _, x := range live.Devices.Disks {
		if x.Source != nil && x.Source.File != nil && overlay.SameFile(x.Source.File.File, m.Paths.Disk) {
			disk = diskName(&x)
		}
	}
	if disk == "" {
		return fmt.Errorf("domain %q has no disk %s", m.Name, m.Paths.Disk)
	}
	base := ""
	if k+1 < len(chain) {
		base = chain[k+1].Path
	}
	if _, err := call(ctx, dom, func(d *libvirt.Domain) (struct{}, error) {
		return struct{}{}, d.BlockRebase(disk, base, 0, 0)
	}); err != nil {
		return fmt.Errorf("drop layer %s: %w", layer, err)
	}
	if err := waitBlockJob(ctx, dom, disk); err != nil {
		return fmt.Errorf("drop layer %s: %w", layer, err)
	}
	if chain, err = overlay.Chain(m.Paths.Disk); err != nil {
		return err
	}
	if overlay.LayerIndex(chain, layer) > 0 {
		return fmt.Errorf("drop layer %s: the block pull ended but the layer is still in %s's chain", layer, m.Name)
	}
	// QEMU closed the earlier tops with the pull; each only kept a dropped
	// template disk alive under a second name.
	overlay.RemoveUnchained(m.Paths.Dir, chain)
	return nil
}

// waitBlockJob polls until disk has no block job. When ctx ends the job is
// aborted: a pull stopped half-way leaves a valid chain.
func waitBlockJob(ctx context.Context, dom *libvirt.Domain, disk string) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		info, err := dom.GetBlockJobInfo(disk, 0)
		if err != nil {
			return wrap(err)
		}
		if info.Type == libvirt.DOMAIN_BLOCK_JOB_TYPE_UNKNOWN {
			return nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			dom.BlockJobAbort(disk, 0)
			return ctx.Err()
		}
	}
}
