//go:build cgo

package libvirtdrv

import (
	"context"
	"fmt"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
)

// detachTimeout bounds the wait for the guest to release one unplugged
// device (PCIe hot-unplug: the guest's driver lets go, then the slot powers
// off; Linux's pciehp alone waits 5 s, more under TCG), as the embedded
// driver's.
const detachTimeout = 90 * time.Second

// detachPoll is how often the live XML is read while a device goes.
const detachPoll = 200 * time.Millisecond

// unpluggable is one device of a domain that forbids a fork (Check) and
// that libvirt can unplug live: an ivshmem device (<shmem>) or a
// passed-through one (<hostdev>).
type unpluggable struct {
	what  string // as Check names it
	alias string // libvirt's name for it in the live XML
	xml   string // its definition, without alias, to attach it back
	// ramBlock is the QEMU RAM block of its memory backend (libvirt's
	// "shmmem-<alias>"), "" for a device without one.
	ramBlock string
}

// detachDevices is the first step of a freeze with --detach-devices
// (detach): it unplugs from src's domain every device Check
// refuses that libvirt can unplug live (virDomainDetachDeviceFlags, LIVE),
// and waits until each is gone from the live definition, so that the
// freeze's checks, its migratable XML (which the children copy) and the
// manifest have none of them. libvirt removes a device's memory backend
// with it and makes a new one when it is attached again (QEMU 7.2 asserts
// when ivshmem is re-plugged on its old backend). replug attaches them back
// (virDomainAttachDeviceFlags, LIVE), after the freeze whatever its outcome;
// a device it cannot attach back is left out, with a warning naming it.
// Without the flag it does nothing: Check refuses such a device, naming it,
// before any pause.
func (d *Driver) detachDevices(ctx context.Context, dom *libvirt.Domain, src *vmfork.Machine, t *vmfork.Template, detach bool) (replug func(context.Context), err error) {
	replug = func(context.Context) {}
	if !detach {
		return replug, nil
	}
	_, live, err := liveXML(ctx, dom, 0)
	if err != nil {
		return replug, err
	}
	devs, err := unpluggables(live)
	if err != nil || len(devs) == 0 {
		return replug, err
	}
	log := d.log.WithField("machine", src.Name)
	var unplugged []unpluggable
	replug = func(ctx context.Context) {
		// Not under the caller's ctx alone: the devices go back also after
		// a cancel.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), detachTimeout)
		defer cancel()
		for _, u := range unplugged {
			if _, err := call(rctx, dom, func(dom *libvirt.Domain) (struct{}, error) {
				return struct{}{}, dom.AttachDeviceFlags(u.xml, libvirt.DOMAIN_DEVICE_MODIFY_LIVE)
			}); err != nil {
				log.WithError(err).Warnf("device %s stays unplugged", u.what)
			}
		}
	}
	for _, u := range devs {
		if err := d.unplug(ctx, dom, u); err != nil {
			replug(ctx)
			return func(context.Context) {}, fmt.Errorf("detach device %s: %w", u.what, err)
		}
		unplugged = append(unplugged, u)
	}
	log.WithField("devices", len(unplugged)).Info("devices detached for the fork")
	return replug, nil
}

// checkAdopt is Check for adoption, without the devices --detach-devices
// unplugs: the fork refuses those itself before any pause (prepareFreeze),
// in the same words, unless it was asked to unplug them.
func checkAdopt(def *libvirtxml.Domain) error {
	c := *def
	if c.Devices != nil {
		dv := *c.Devices
		dv.Shmems, dv.Hostdevs = nil, nil
		c.Devices = &dv
	}
	return Check(&c)
}

// unpluggables lists the live domain's devices that --detach-devices
// unplugs.
func unpluggables(live *libvirtxml.Domain) ([]unpluggable, error) {
	if live.Devices == nil {
		return nil, nil
	}
	var out []unpluggable
	for _, s := range live.Devices.Shmems {
		alias := ""
		if s.Alias != nil {
			alias = s.Alias.Name
		}
		s.Alias = nil
		x, err := s.Marshal()
		if err != nil {
			return nil, err
		}
		out = append(out, unpluggable{what: fmt.Sprintf("<shmem name='%s'>", s.Name), alias: alias, xml: x, ramBlock: "shmmem-" + alias})
	}
	for _, h := range live.Devices.Hostdevs {
		alias := ""
		if h.Alias != nil {
			alias = h.Alias.Name
		}
		h.Alias = nil
		x, err := h.Marshal()
		if err != nil {
			return nil, err
		}
		out = append(out, unpluggable{what: fmt.Sprintf("<hostdev> %s", alias), alias: alias, xml: x})
	}
	return out, nil
}

// unplug detaches u and waits until the guest has released it: libvirt
// returns from a detach after waiting a few seconds for QEMU's
// DEVICE_DELETED, with the removal still going on if the guest is slower.
func (d *Driver) unplug(ctx context.Context, dom *libvirt.Domain, u unpluggable) error {
	ctx, cancel := context.WithTimeout(ctx, detachTimeout)
	defer cancel()
	if _, err := call(ctx, dom, func(dom *libvirt.Domain) (struct{}, error) {
		return struct{}{}, dom.DetachDeviceFlags(u.xml, libvirt.DOMAIN_DEVICE_MODIFY_LIVE)
	}); err != nil {
		return fmt.Errorf("virDomainDetachDeviceFlags: %w", err)
	}
	tick := time.NewTicker(detachPoll)
	defer tick.Stop()
	for {
		_, live, err := liveXML(ctx, dom, 0)
		if err != nil {
			return err
		}
		if !hasAlias(live, u.alias) {
			gone, err := ramBlockGone(ctx, monitor{dom: dom, log: d.log}, u.ramBlock)
			if err != nil || gone {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the guest did not release it within %v", detachTimeout)
		case <-tick.C:
		}
	}
}

// ramBlockGone reports whether QEMU has freed the RAM block called name
// (any device path before it). libvirt drops a <shmem> from the live XML once
// it has deleted its memory backend, but QEMU frees the block later, after an
// RCU grace period: a migration stream saved before then carries the block,
// and a child, which has no such device, refuses it ("Unknown ramblock").
func ramBlockGone(ctx context.Context, ex qmp.Executor, name string) (bool, error) {
	if name == "" {
		return true, nil
	}
	blocks, err := qemustate.NonRAMBlocks(ctx, ex, ramAlias)
	if err != nil {
		return false, err
	}
	return qemustate.BlockOf(blocks, name) == "", nil
}

// hasAlias reports whether the live domain still has the shmem or hostdev
// device libvirt calls alias.
func hasAlias(live *libvirtxml.Domain, alias string) bool {
	if live.Devices == nil {
		return false
	}
	for _, s := range live.Devices.Shmems {
		if s.Alias != nil && s.Alias.Name == alias {
			return true
		}
	}
	for _, h := range live.Devices.Hostdevs {
		if h.Alias != nil && h.Alias.Name == alias {
			return true
		}
	}
	return false
}
