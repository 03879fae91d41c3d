//go:build cgo

package libvirtdrv

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
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
