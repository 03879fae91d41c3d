package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vmfork/vmfork/contract"
)

// Resolver resolves an allow list's host names on the host. *net.Resolver
// is one (net.DefaultResolver); tests pass a fake.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Proto is a set of transport protocols an allowed tuple applies to.
type Proto uint8

const (
	TCP Proto = 1 << iota
	UDP
)

// String is "tcp", "udp" or "tcp+udp".
func (p Proto) String() string {
	var s []string
	if p&TCP != 0 {
		s = append(s, "tcp")
	}
	if p&UDP != 0 {
		s = append(s, "udp")
	}
	return strings.Join(s, "+")
}

// Tuple is one destination the machine may open connections and send
// datagrams to.
type Tuple struct {
	Prefix netip.Prefix
	// Port is the destination port, 0 for any.
	Port uint16
	// Protos is what the tuple applies to: an allow list entry is for TCP
	// and UDP alike.
	Protos Proto
	// From is the allow-list entry the tuple came from, as written (a host
	// name's entry gives one tuple per address it resolved to).
	From string
}

// String is "tcp+udp 10.0.0.5 port 443", or "... any port".
func (t Tuple) String() string {
	addr := t.Prefix.String()
	if t.Prefix.IsSingleIP() {
		addr = t.Prefix.Addr().String()
	}
	if t.Port == 0 {
		return t.Protos.String() + " " + addr + " any port"
	}
	return fmt.Sprintf("%s %s port %d", t.Protos, addr, t.Port)
}

// LinkLocal reports whether the tuple names link-local addresses on
// purpose: its whole prefix lies inside 169.254.0.0/16 or fe80::/10. Only
// such a tuple lifts the link-local deny; a broad one (0.0.0.0/0:443)
// does not reach the metadata service by accident.
func (t Tuple) LinkLocal() bool {
	for _, ll := range LinkLocal {
		if ll.Addr().BitLen() == t.Prefix.Addr().BitLen() && t.Prefix.Bits() >= ll.Bits() && ll.Contains(t.Prefix.Addr()) {
			return true
		}
	}
	return false
}

// LinkLocal are the link-local prefixes. They are denied to a machine with
// a contract, under every egress mode, egress all included, unless an
// allow entry names an address inside them: 169.254.169.254 is the cloud
// metadata service of AWS, GCP, Azure and OpenStack, which hands out the
// host's credentials to whoever asks from the host's network, the classic
// way out of a sandbox. IPv6 neighbour discovery (ICMPv6 to fe80::/10 and
// ff02::/16) stays allowed on a bridge: without it no IPv6 works at all.
var LinkLocal = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
}

// Rules is a network contract made ready for enforcement: host names
// resolved on the host, tuples ordered.
//
// Every enforcement point applies them in this order, first match wins:
//  1. always: ARP, DHCP client to server, IPv6 neighbour discovery (on a
//     bridge), and replies on connections made to the machine;
//  2. DNS to the resolver addresses the caller names: accepted for DNS
//     host, dropped for DNS none, whatever the allow list says (none is
//     explicit, so it wins over an entry that happens to cover them);
//  3. allowed tuples inside link-local prefixes;
//  4. everything else to link-local: dropped;
//  5. the other allowed tuples;
//  6. the mode's default: accepted for egress all, dropped otherwise.
type Rules struct {
	Mode contract.EgressMode
	// Allow is the allowed tuples, link-local ones first (empty unless
	// Mode is allow).
	Allow []Tuple
	DNS   contract.DNSMode
}

// ErrUnresolved is wrapped by Compile's error for an allow-list host name
// that does not resolve on the host.
var ErrUnresolved = errors.New("host name does not resolve")

// unresolvedError is a host name the host could not resolve.
type unresolvedError struct {
	host string
	err  error
}

func (e unresolvedError) Error() string {
	return fmt.Sprintf("host %q does not resolve on the host: %v", e.host, e.err)
}
func (e unresolvedError) Unwrap() []error { return []error{e.err, ErrUnresolved} }

// Compile makes n ready for enforcement. Host names in the allow list are
// resolved here, on the host, with r (net.DefaultResolver when nil), never
// by the guest's DNS: a name the guest could answer itself would let it
// allow whatever it likes. A name that does not resolve is an error naming
// its entry (a *contract.Error wrapping ErrUnresolved). Names are
// resolved once, when the rules are made (a fork, a --set): addresses a
// name gets later are not allowed until the rules are made again. n is
// expected to
// be valid (contract.Contract.Validate); the empty modes take their
// defaults.
func Compile(ctx context.Context, n contract.Network, r Resolver) (Rules, error) {
	if r == nil {
		r = net.DefaultResolver
	}
	out := Rules{Mode: n.Egress.Mode, DNS: n.DNS}
	if out.Mode == "" {
		out.Mode = contract.EgressAll
	}
	if out.DNS == "" {
		out.DNS = contract.DNSHost
	}
	switch out.Mode {
	case contract.EgressAll, contract.EgressNone:
		return out, nil
	case contract.EgressAllow:
	default:
		return Rules{}, fmt.Errorf("egress: mode %q: %w", out.Mode, contract.ErrInvalid)
	}
	var allow []Tuple
	for i, d := range n.Egress.Allow {
		ts, err := tuples(ctx, d, r)
		if err != nil {
			return Rules{}, &contract.Error{Field: fmt.Sprintf("network.egress.allow[%d]", i), Err: err}
		}
		for _, t := range ts {
			if !slices.ContainsFunc(allow, func(u Tuple) bool { return u.Prefix == t.Prefix && u.Port == t.Port }) {
				allow = append(allow, t)
			}
		}
	}
	if len(allow) == 0 {
		return Rules{}, &contract.Error{Field: "network.egress.allow", Err: fmt.Errorf("lists no destination: %w", contract.ErrInvalid)}
	}
	// Link-local tuples first: they come before the link-local drop.
	slices.SortStableFunc(allow, func(a, b Tuple) int {
		switch {
		case a.LinkLocal() == b.LinkLocal():
			return 0
		case a.LinkLocal():
			return -1
		}
		return 1
	})
	out.Allow = allow
	return out, nil
}

// tuples is d's tuples: one for a prefix, one per address for a host name.
func tuples(ctx context.Context, d contract.Dest, r Resolver) ([]Tuple, error) {
	if d.Port < 0 || d.Port > 65535 {
		return nil, fmt.Errorf("port %d: %w", d.Port, contract.ErrInvalid)
	}
	port := uint16(d.Port)
	if d.Host == "" {
		if !d.Prefix.IsValid() {
			return nil, fmt.Errorf("neither a host nor a prefix: %w", contract.ErrInvalid)
		}
		return []Tuple{{Prefix: d.Prefix.Masked(), Port: port, Protos: TCP | UDP, From: d.String()}}, nil
	}
	addrs, err := r.LookupNetIP(ctx, "ip", d.Host)
	if err == nil && len(addrs) == 0 {
		err = errors.New("no address")
	}
	if err != nil {
		return nil, unresolvedError{host: d.Host, err: err}
	}
	var out []Tuple
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		out = append(out, Tuple{Prefix: netip.PrefixFrom(a, a.BitLen()), Port: port, Protos: TCP | UDP, From: d.String()})
	}
	return out, nil
}

// Lines describes r, one line a rule, in the order of Rules' doc, for the
// given resolver addresses (what DNS may go to). They are what
// enforcement puts in the comments of the rules it makes.
func (r Rules) Lines(dns []netip.Addr) []string {
	var out []string
	for _, a := range dns {
		out = append(out, dnsComment(r.DNS, a))
	}
	for _, t := range r.Allow {
		if t.LinkLocal() {
			out = append(out, allowComment(t))
		}
	}
	for _, ll := range LinkLocal {
		out = append(out, "drop link-local "+ll.String())
	}
	for _, t := range r.Allow {
		if !t.LinkLocal() {
			out = append(out, allowComment(t))
		}
	}
	return append(out, defaultComment(r.Mode))
}

// clip bounds a rule's comment: nftables keeps 256 bytes of a rule's
// user data, libvirt 256 characters of a comment, and a host name alone
// may have 253.
func clip(s string) string {
	if len(s) > 200 {
		return s[:197] + "..."
	}
	return s
}

func dnsComment(m contract.DNSMode, a netip.Addr) string {
	if m == contract.DNSNone {
		return "drop DNS to " + a.String() + " (dns: none)"
	}
	return "accept DNS to " + a.String() + " (dns: host)"
}

func allowComment(t Tuple) string {
	return clip("accept " + t.String() + " (allow " + t.From + ")")
}

func defaultComment(m contract.EgressMode) string {
	if m == contract.EgressAll {
		return "accept everything else (egress: all)"
	}
	return "drop everything else (egress: " + string(m) + ")"
}

// UserNetdevOptions are the options to add to QEMU's -netdev user for r, a
// second layer under the host's rules: restrict=on for egress none with
// DNS none, nothing otherwise. restrict=on drops every guest packet slirp
// would forward (libslirp udp_input drops all UDP but DHCP and TFTP, DNS
// to 10.0.2.3 included, and DHCP then offers no gateway and no DNS), so it
// fits only a machine that may reach nothing at all. It is fixed when
// QEMU starts: see CheckUserChange.
func UserNetdevOptions(r Rules) []string {
	if r.Mode == contract.EgressNone && r.DNS == contract.DNSNone {
		return []string{"restrict=on"}
	}
	return nil
}

// ErrRestricted is wrapped by CheckUserChange's error.
var ErrRestricted = errors.New("user-mode network started with restrict=on")

// CheckUserChange reports whether a user-mode machine started under
// started can take next in place (vmfork contract NAME --set). A machine
// started with restrict=on (UserNetdevOptions) cannot be widened: slirp's
// restrict is part of the netdev, and QEMU cannot change it, or swap the
// netdev under a running NIC. Such a machine stays as it is; a child
// forked from it with the wider contract starts a new slirp.
func CheckUserChange(started, next Rules) error {
	if len(UserNetdevOptions(started)) > 0 && len(UserNetdevOptions(next)) == 0 {
		return fmt.Errorf("egress %s, dns %s: the machine's user-mode network was started with restrict=on (egress none, dns none), which cannot be lifted on a running machine; fork a child with the new contract instead: %w",
			next.Mode, next.DNS, ErrRestricted)
	}
	return nil
}
