//go:build cgo

package libvirtdrv

import (
	"context"
	"errors"
	"fmt"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
)

var _ vmfork.NetworkChecker = (*Driver)(nil)

// CheckNetwork implements vmfork.NetworkChecker: every NIC of m's domain (of
// its record when it has no domain yet) is on something that is there: a
// libvirt network that is active, or a host bridge. A NIC with nothing
// behind it (network none) is the embedded driver's only.
func (d *Driver) CheckNetwork(ctx context.Context, m *vmfork.Machine) error {
	var ifcs []libvirtxml.DomainInterface
	dom, err := d.domain(m)
	if err != nil {
		return err
	}
	if dom != nil {
		defer dom.Free()
		_, def, err := liveXML(ctx, dom, 0)
		if err != nil {
			return err
		}
		if def.Devices != nil {
			ifcs = def.Devices.Interfaces
		}
	} else {
		n := m.Spec.Network.Effective()
		if n.Kind == vmfork.NetworkNone {
			return fmt.Errorf("machine %q: network none: a libvirt domain's NIC needs something behind it; use an isolated libvirt network (network=NAME) instead: %w", m.Name, vmfork.ErrInvalid)
		}
		if err := checkSessionNetwork(d.uri, m, n); err != nil {
			return err
		}
		ifcs = []libvirtxml.DomainInterface{{Source: interfaceSource(n)}}
	}
	for _, ifc := range ifcs {
		if err := d.checkInterface(ifc); err != nil {
			return fmt.Errorf("machine %q: %w", m.Name, err)
		}
	}
	return nil
}

func (d *Driver) checkInterface(ifc libvirtxml.DomainInterface) error {
	src := ifc.Source
	switch {
	case src == nil:
		return nil
	case src.Bridge != nil:
		return vmfork.CheckBridge(src.Bridge.Bridge)
	case src.Network == nil:
		return nil
	}
	name := src.Network.Network
	net, err := d.conn.LookupNetworkByName(name)
	if errors.Is(err, libvirt.ERR_NO_NETWORK) {
		return fmt.Errorf("libvirt network %q does not exist (virsh net-list --all): %w", name, vmfork.ErrInvalid)
	}
	if err != nil {
		return fmt.Errorf("look up libvirt network %q: %w", name, wrap(err))
	}
	defer net.Free()
	active, err := net.IsActive()
	if err != nil {
		return fmt.Errorf("libvirt network %q: %w", name, wrap(err))
	}
	if !active {
		return fmt.Errorf("libvirt network %q is not active (virsh net-start %s): %w", name, name, vmfork.ErrInvalid)
	}
	return nil
}
