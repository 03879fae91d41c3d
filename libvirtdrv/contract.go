//go:build cgo

package libvirtdrv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/broker"
	"github.com/vmfork/vmfork/contract"
	"github.com/vmfork/vmfork/egress"
)

// A machine's fork contract on a libvirt host: its network part is a
// network filter of the machine's own (nwfilter.go), which the domain's
// interface references from the start. libvirt applies it when the
// interface comes up and drops it with the interface; vmfork undefines
// the filter once the domain is gone (Stop), and redefines it in place
// for vmfork contract NAME --set.

var _ vmfork.Enforcer = (*Driver)(nil)

// compileTimeout bounds resolving a contract's host names.
const compileTimeout = 10 * time.Second

// filterName is machine m's network filter.
func filterName(m *vmfork.Machine) string { return "vmfork-" + m.Name }

// CheckContract implements vmfork.Enforcer.
func (d *Driver) CheckContract(ctx context.Context, m *vmfork.Machine, c *contract.Contract) error {
	if c == nil || c.Network == nil {
		return nil
	}
	if err := bounded(ctx, "virConnectNumOfNWFilters", func() error { _, err := d.conn.NumOfNWFilters(); return err }); err != nil {
		return fmt.Errorf("network: libvirt's network filters (nwfilter) do not answer: %w: %w", wrap(err), vmfork.ErrUnsupported)
	}
	_, err := d.filterXML(ctx, m, c)
	return err
}

// filterXML is machine m's network filter for contract c.
func (d *Driver) filterXML(ctx context.Context, m *vmfork.Machine, c *contract.Contract) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, compileTimeout)
	defer cancel()
	r, err := egress.Compile(cctx, *c.Network, nil)
	if err != nil {
		return "", fmt.Errorf("%w: %w", err, vmfork.ErrInvalid)
	}
	if m.Broker != nil && r.Mode != contract.EgressAll {
		// Its secrets proxy (brokered.go), on the network's host address.
		ap, err := netip.ParseAddrPort(m.Broker.Listen.Address)
		if err != nil {
			return "", fmt.Errorf("secrets proxy at %s: %w", m.Broker.Listen, err)
		}
		r.Mode = contract.EgressAllow
		r.Allow = append(r.Allow, egress.Tuple{Prefix: netip.PrefixFrom(ap.Addr(), ap.Addr().BitLen()), Port: ap.Port(), Protos: egress.TCP, From: "the secrets proxy"})
	}
	xml, err := egress.NWFilterXML(filterName(m), r, egress.NWFilterOptions{DNS: d.networkAddrs(ctx, m)})
	if err != nil {
		return "", fmt.Errorf("network filter: %w", err)
	}
	return xml, nil
}

// networkAddrs are the host's addresses on m's libvirt network, where its
// dnsmasq answers DNS; none for a bridge or a network without one.
func (d *Driver) networkAddrs(ctx context.Context, m *vmfork.Machine) []netip.Addr {
	n := m.Spec.Network.Effective()
	if n.Kind != vmfork.NetworkLibvirt {
		return nil
	}
	var x string
	err := bounded(ctx, "virNetworkGetXMLDesc", func() error {
		net, err := d.conn.LookupNetworkByName(n.Name)
		if err != nil {
			return err
		}
		defer net.Free()
		x, err = net.GetXMLDesc(0)
		return err
	})
	if err != nil {
		return nil
	}
	var def libvirtxml.Network
	if def.Unmarshal(x) != nil {
		return nil
	}
	var out []netip.Addr
	for _, ip := range def.IPs {
		if a, err := netip.ParseAddr(ip.Address); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// withContractFilter defines machine m's network filter, if its contract
// has a network part, and references it from every interface of def. The
// filter must exist before the domain starts. undo undefines it.
func (d *Driver) withContractFilter(ctx context.Context, m *vmfork.Machine, def *libvirtxml.Domain) (undo func(), err error) {
	undo = func() {}
	if m.Contract == nil || m.Contract.Network == nil || def.Devices == nil {
		return undo, nil
	}
	if err := checkSessionContract(d.uri, m); err != nil {
		return undo, err
	}
	xml, err := d.filterXML(ctx, m, m.Contract)
	if err != nil {
		return undo, fmt.Errorf("machine %q: contract: %w", m.Name, err)
	}
	name := filterName(m)
	if err := defineFilter(ctx, d.conn, name, xml); err != nil {
		return undo, fmt.Errorf("machine %q: contract: %w", m.Name, err)
	}
	for i := range def.Devices.Interfaces {
		def.Devices.Interfaces[i].FilterRef = filterRef(name)
	}
	return func() { d.removeFilter(m) }, nil
}

// removeFilter undefines machine m's network filter; a failure is logged
// (libvirt refuses while an interface still uses it).
func (d *Driver) removeFilter(m *vmfork.Machine) {
	if m.Contract == nil || m.Contract.Network == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := undefineFilter(ctx, d.conn, filterName(m)); err != nil {
		d.log.WithField("machine", m.Name).WithError(err).Warn("network filter left defined")
	}
}

// ApplyContract implements vmfork.Enforcer: the machine's filter is
// redefined in place, and libvirt re-applies it to its interface. A domain
// started without a filter has no reference to one: libvirt adds a filter
// to an interface only when it comes up, so that machine is refused (fork
// it with the contract).
func (d *Driver) ApplyContract(ctx context.Context, m *vmfork.Machine, c *contract.Contract) error {
	if m.Contract == nil || m.Contract.Network == nil {
		return fmt.Errorf("machine %q was started without a network contract, and libvirt attaches a network filter to an interface only when it comes up: fork it with the contract instead: %w", m.Name, vmfork.ErrUnsupported)
	}
	if c == nil || c.Network == nil {
		c = &contract.Contract{Network: &contract.Network{Egress: contract.Egress{Mode: contract.EgressAll}, DNS: contract.DNSHost, Connections: contract.ConnKeep}}
	}
	xml, err := d.filterXML(ctx, m, c)
	if err != nil {
		return err
	}
	return defineFilter(ctx, d.conn, filterName(m), xml)
}

// DescribeContract implements vmfork.Enforcer: the filter's name and its
// rules as libvirt holds them.
func (d *Driver) DescribeContract(ctx context.Context, m *vmfork.Machine) ([]string, error) {
	if m.Contract == nil || m.Contract.Network == nil {
		return nil, nil
	}
	name := filterName(m)
	var x string
	err := bounded(ctx, "virNWFilterGetXMLDesc", func() error {
		f, err := d.conn.LookupNWFilterByName(name)
		if err != nil {
			return err
		}
		defer f.Free()
		x, err = f.GetXMLDesc(0)
		return err
	})
	if errors.Is(err, libvirt.ERR_NO_NWFILTER) {
		return []string{"network filter " + name + " is missing"}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("network filter %s: %w", name, wrap(err))
	}
	var def libvirtxml.NWFilter
	if err := def.Unmarshal(x); err != nil {
		return nil, fmt.Errorf("network filter %s: %w", name, err)
	}
	lines := []string{fmt.Sprintf("libvirt network filter %s (virsh nwfilter-dumpxml %s): %d rules", name, name, len(def.Entries))}
	return lines, nil
}

var _ vmfork.BrokerEndpoint = (*Driver)(nil)

// BrokerListen implements vmfork.BrokerEndpoint: a libvirt domain's
// secrets proxy listens on its network's host address (where its
// dnsmasq answers), or its bridge's. The domain's own network filter lets
// it reach its port only; a domain of the network without a contract
// could reach it too, and is not told apart (the embedded driver's user
// network tells them apart by their QEMU: docs/SECURITY.md).
func (d *Driver) BrokerListen(m *vmfork.Machine) (broker.Addr, bool, error) {
	n := m.Spec.Network.Effective()
	var addrs []netip.Addr
	switch n.Kind {
	case vmfork.NetworkLibvirt:
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		addrs = d.networkAddrs(ctx, m)
	case vmfork.NetworkBridge:
		if a, err := hostAddr(n.Name); err == nil {
			addrs = []netip.Addr{a}
		}
	}
	for _, a := range addrs {
		if a.Is4() {
			return broker.Addr{Network: "tcp", Address: net.JoinHostPort(a.String(), "0")}, false, nil
		}
	}
	return broker.Addr{}, false, fmt.Errorf("machine %q: network %s has no IPv4 address on the host, where its secrets proxy would listen: %w", m.Name, n, vmfork.ErrUnsupported)
}

// ProxyURL implements vmfork.BrokerEndpoint.
func (d *Driver) ProxyURL(m *vmfork.Machine, a broker.Addr) (string, error) {
	if _, err := netip.ParseAddrPort(a.Address); err != nil || a.Network != "tcp" {
		return "", fmt.Errorf("machine %q: secrets proxy at %s: want a tcp address", m.Name, a)
	}
	return "http://" + a.Address, nil
}

// hostAddr is interface name's first IPv4 address on the host.
func hostAddr(name string) (netip.Addr, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}, err
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%s has no IPv4 address", name)
}
