package broker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vmfork/vmfork/contract"
)

// ErrDenied is wrapped by the error of a connection the proxy refuses to
// open: the child's egress does not allow its destination.
var ErrDenied = errors.New("not allowed by the machine's egress")

// egressAllows reports whether a child with egress e may reach ip:port
// through its proxy; name is the host name asked for ("" for an address).
//
// The proxy runs on the host, so it must never widen what the child may
// reach: egress all lets through what a guest on a network could reach,
// which is not the host's own loopback; link-local (cloud metadata at
// 169.254.169.254) is denied as the contract denies it; and both, with
// the unspecified and multicast addresses, pass only when an allow entry
// names them (a prefix holding the address, or the host name).
func egressAllows(e *contract.Egress, name string, ip netip.Addr, port int) bool {
	ip = ip.Unmap()
	allowed, listed := false, false
	switch {
	case e == nil || e.Mode == contract.EgressAll || e.Mode == "":
		allowed = true
	case e.Mode == contract.EgressAllow:
		for _, d := range e.Allow {
			if d.Port != 0 && d.Port != port {
				continue
			}
			if d.Host != "" && name != "" && d.Host == name || d.Host == "" && d.Prefix.Contains(ip) {
				allowed, listed = true, true
				break
			}
		}
	}
	if hostOnly(ip) && !listed {
		return false
	}
	return allowed
}

// hostOnly is an address that means the host itself or its link, never
// a destination out on a network.
func hostOnly(ip netip.Addr) bool {
	return ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsUnspecified() || ip.IsMulticast() || ip.IsInterfaceLocalMulticast()
}

// normHost is a host name as secrets and allow lists spell it: lower
// case, no trailing dot, no IPv6 brackets.
func normHost(h string) string {
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	return strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
}

// hostOfAuthority is the host of HOST[:PORT].
func hostOfAuthority(a string) string {
	if h, _, err := net.SplitHostPort(a); err == nil {
		return normHost(h)
	}
	return normHost(a)
}

// dial opens a TCP connection to addr (HOST:PORT) for the child: the name
// is resolved on the host (never by the guest's DNS), each address is
// checked against the child's egress, and only an allowed address is
// dialed, so a name that resolves differently between the check and the
// dial cannot slip through.
func (p *Proxy) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 {
		return nil, fmt.Errorf("vmfork broker: %q: bad port", addr)
	}
	var (
		name  string
		addrs []netip.Addr
	)
	if ip, err := netip.ParseAddr(normHost(host)); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		name = normHost(host)
		if addrs, err = p.lookup(ctx, name); err != nil {
			return nil, fmt.Errorf("vmfork broker: resolve %s: %w", name, err)
		}
	}
	egress := p.cfg.Load().child.Egress
	var errs []error
	for _, ip := range addrs {
		if !egressAllows(egress, name, ip, port) {
			continue
		}
		d := net.Dialer{Timeout: p.opts.Limits.DialTimeout}
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(ip.Unmap(), uint16(port)).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("vmfork broker: machine %q may not reach %s: %w", p.name, addr, ErrDenied)
	}
	return nil, errors.Join(errs...)
}

func (p *Proxy) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	if p.opts.LookupNetIP != nil {
		return p.opts.LookupNetIP(ctx, name)
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip", name)
}
