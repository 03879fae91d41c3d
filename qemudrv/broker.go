package qemudrv

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/broker"
)

// Brokered secrets (vmfork's brokered.go, package broker): where a
// machine's proxy listens, so that only that machine reaches it.
//
// On QEMU's user network the guest reaches the host's loopback at
// slirpHost: QEMU's slirp opens a host socket to 127.0.0.1 for it. So the
// proxy listens on a loopback port of its own, and the broker lets in only
// connections whose host end is held by the machine's own QEMU
// (broker.Child.FromPID): every user-network machine comes from
// 127.0.0.1. A guestfwd forward could name a guest address instead, but
// its chardev form carries one connection at a time, and its cmd: form
// spawns a process, which QEMU's sandbox (-sandbox spawn=deny) forbids.
//
// On a bridge the proxy listens on the bridge's own host address, which
// the machine reaches through its tap (the egress rules, if any, let it
// through to that port only).

// slirpHost is the host as a user-network guest sees it (QEMU's default
// net=10.0.2.0/24).
const slirpHost = "10.0.2.2"

var _ vmfork.BrokerEndpoint = (*Driver)(nil)

// BrokerListen implements vmfork.BrokerEndpoint.
func (d *Driver) BrokerListen(m *vmfork.Machine) (broker.Addr, bool, error) {
	n := m.Spec.Network.Effective()
	switch n.Kind {
	case vmfork.NetworkUser:
		return broker.Addr{Network: "tcp", Address: "127.0.0.1:0"}, true, nil
	case vmfork.NetworkBridge:
		a, err := bridgeAddr(n.Name)
		if err != nil {
			return broker.Addr{}, false, err
		}
		return broker.Addr{Network: "tcp", Address: net.JoinHostPort(a.String(), "0")}, false, nil
	}
	return broker.Addr{}, false, fmt.Errorf("machine %q: network %s reaches nothing, so it has no secrets proxy to reach: %w", m.Name, n, vmfork.ErrUnsupported)
}

// ProxyURL implements vmfork.BrokerEndpoint.
func (d *Driver) ProxyURL(m *vmfork.Machine, a broker.Addr) (string, error) {
	ap, err := netip.ParseAddrPort(a.Address)
	if err != nil || a.Network != "tcp" {
		return "", fmt.Errorf("machine %q: secrets proxy at %s: want a tcp address", m.Name, a)
	}
	host := ap.Addr().String()
	if m.Spec.Network.Effective().Kind == vmfork.NetworkUser {
		host = slirpHost
	}
	return fmt.Sprintf("http://%s", net.JoinHostPort(host, fmt.Sprint(ap.Port()))), nil
}

// bridgeAddr is bridge's first IPv4 address on the host.
func bridgeAddr(bridge string) (netip.Addr, error) {
	ifi, err := net.InterfaceByName(bridge)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("bridge %q: %w", bridge, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("bridge %q: %w", bridge, err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("bridge %q has no IPv4 address on the host, where a machine's secrets proxy would listen (give it one, or use QEMU's user network): %w", bridge, vmfork.ErrUnsupported)
}
