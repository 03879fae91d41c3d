package libvirtdrv

import (
	"fmt"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
)

// Children on shared networks. A child's <interface> is its source's, on the
// same libvirt network or bridge; libvirt gives it a port and a tap of its
// own. Its MAC in the XML is the one its identity chain gives the guest: the
// guest wakes with the source's (it travels in the device state) and takes
// its own before its link goes up, and QEMU's NIC then already has it too,
// so a reboot keeps it, `virsh domiflist` shows it and a macvtap (type
// 'direct') lets the child's frames through. libvirt's network dnsmasq
// leases by the MAC in the DHCP request, so `virsh net-dhcp-leases` lists
// each child under its own MAC.

// interfaceSource is the <source> of a booted domain's NIC on network n.
func interfaceSource(n vmfork.Network) *libvirtxml.DomainInterfaceSource {
	n = n.Effective()
	switch n.Kind {
	case vmfork.NetworkBridge:
		return &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: n.Name}}
	case vmfork.NetworkLibvirt:
		return &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: n.Name}}
	}
	return &libvirtxml.DomainInterfaceSource{User: &libvirtxml.DomainInterfaceSourceUser{}}
}

// networkOf says in vmfork's terms what the first NIC of domain d is plugged
// into; the zero Network (user) when it has none vmfork knows.
func networkOf(d *libvirtxml.Domain) vmfork.Network {
	if d.Devices == nil || len(d.Devices.Interfaces) == 0 {
		return vmfork.Network{Kind: vmfork.NetworkNone}
	}
	src := d.Devices.Interfaces[0].Source
	switch {
	case src == nil:
	case src.Network != nil:
		return vmfork.Network{Kind: vmfork.NetworkLibvirt, Name: src.Network.Network}
	case src.Bridge != nil:
		return vmfork.Network{Kind: vmfork.NetworkBridge, Name: src.Bridge.Bridge}
	}
	return vmfork.Network{Kind: vmfork.NetworkUser}
}

// childInterfaces turns the source's NICs into child c's: what libvirt made
// for the source's connection (tap name, alias, network port and the bridge
// it resolved) goes, so that libvirt makes the child its own, and the first
// NIC gets the child's MAC. Others get none, so libvirt picks one; Check
// refuses a second NIC on a shared network, whose guest side would keep the
// source's MAC.
func childInterfaces(ifcs []libvirtxml.DomainInterface, c *vmfork.Machine) {
	mac := c.GuestMAC
	if mac == "" {
		mac = c.Spec.MAC
	}
	for i := range ifcs {
		ifc := &ifcs[i]
		ifc.Target, ifc.Alias, ifc.Link = nil, nil, nil
		if s := ifc.Source; s != nil && s.Network != nil {
			s.Network.PortID, s.Network.Bridge = "", ""
		}
		ifc.MAC = nil
		if i == 0 && mac != "" {
			ifc.MAC = &libvirtxml.DomainInterfaceMAC{Address: mac}
		}
	}
}

// checkInterfaces adds what in a domain's NICs stops its children from
// working on their network.
func checkInterfaces(ifcs []libvirtxml.DomainInterface, add func(el, why, fix string)) {
	for i, n := range ifcs {
		src := n.Source
		switch {
		case src == nil:
			continue
		case src.VHostUser != nil:
			add("<interface type='vhostuser'>", "vhost-user needs really shared memory, which a fork child does not have", "use another interface type")
		case src.Hostdev != nil:
			add("<interface type='hostdev'>", "QEMU 7.2 cannot save a passed-through network device's state",
				"use <interface type='network'> or type='bridge', or detach it before the fork and attach it again after")
		case src.VDPA != nil:
			add("<interface type='vdpa'>", "a vDPA device's state does not migrate with QEMU 7.2", "use <interface type='network'> or type='bridge'")
		case i > 0 && src.User == nil:
			// A user-mode network is the domain's own; anything else is
			// shared with other machines.
			add(fmt.Sprintf("<interface type='%s'> (NIC %d)", interfaceType(src), i+1),
				"a child gets a MAC and lease of its own on its first NIC only; on this shared network it would keep its source's",
				"keep other NICs off shared networks (type='user'), or detach this one before the fork")
		}
	}
}

// interfaceType is the type attribute of an <interface>, which libvirtxml
// turns into the choice of source.
func interfaceType(s *libvirtxml.DomainInterfaceSource) string {
	switch {
	case s.Network != nil:
		return "network"
	case s.Bridge != nil:
		return "bridge"
	case s.Direct != nil:
		return "direct"
	case s.Ethernet != nil:
		return "ethernet"
	case s.User != nil:
		return "user"
	}
	return "other"
}
