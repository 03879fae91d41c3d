package egress

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork/contract"
)

// NWFilterOptions is what a libvirt network adds to Rules.
type NWFilterOptions struct {
	// DNS is the addresses DNS may go to under DNS host (dropped under
	// DNS none): the libvirt network's own addresses, where its dnsmasq
	// answers.
	DNS []netip.Addr
}

// nwfilterName is what libvirt takes as a filter name, kept to the
// characters vmfork's names use.
var nwfilterName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Priorities of the filter's rules: libvirt orders a filter's rules by
// priority (-1000 to 1000, lower first), per layer. ebtables (Ethernet)
// and iptables/ip6tables (IP) rules are separate layers, each with its
// own order.
const (
	prioL2Accept  = -500
	prioReplies   = 50
	prioInbound   = 60
	prioAlways    = 100
	prioDNS       = 200
	prioLLAllow   = 300
	prioLLDrop    = 400
	prioAllow     = 500
	prioDefault   = 900
	prioL2Default = 1000
)

// NWFilterXML is a libvirt network filter (virsh nwfilter-define) named
// filterName that enforces r on the traffic of the interface that
// references it (<filterref filter='NAME'/>): libvirt's own mechanism,
// listed by virsh nwfilter-list and shown in the domain XML.
//
// Direction out is traffic from the machine. The rules, by layer:
//   - Ethernet (ebtables): ARP, IPv4 and IPv6 pass on to the IP layer;
//     every other frame is dropped (a VLAN-tagged frame would carry IP
//     past the IP layer's rules).
//   - IP (iptables and ip6tables, through the bridge's netfilter hooks):
//     packets of established connections and related ones (ICMP errors)
//     in both directions, new connections and ICMPv6 toward the machine;
//     DHCP, DHCPv6, IPv6 neighbour discovery and MLD from it (with
//     libvirt's state matching off: conntrack leaves ND untracked, and
//     DHCP answers come by broadcast); then r in Rules' order, opts.DNS
//     as the DNS addresses, and the mode's default. libvirt makes each
//     accept also accept the replies; it makes each drop stateless and
//     mirrors it toward the machine (source for destination), which only
//     drops there what the first rules did not accept.
func NWFilterXML(filterName string, r Rules, opts NWFilterOptions) (string, error) {
	if !nwfilterName.MatchString(filterName) {
		return "", fmt.Errorf("egress: nwfilter name %q: want letters, digits, '.', '_' and '-': %w", filterName, contract.ErrInvalid)
	}
	if err := checkRules(r); err != nil {
		return "", err
	}
	f := &libvirtxml.NWFilter{Name: filterName, Chain: "root"}
	add := func(rule libvirtxml.NWFilterRule) {
		f.Entries = append(f.Entries, libvirtxml.NWFilterEntry{Rule: &rule})
	}
	// Ethernet layer.
	add(libvirtxml.NWFilterRule{Action: "accept", Direction: "out", Priority: prioL2Accept,
		ARP: &libvirtxml.NWFilterRuleARP{Comment: "ARP"}})
	for _, id := range []string{"ipv4", "ipv6"} {
		add(libvirtxml.NWFilterRule{Action: "accept", Direction: "out", Priority: prioL2Accept,
			MAC: &libvirtxml.NWFilterRuleMAC{ProtocolID: str(id), Comment: id + " goes on to the IP layer"}})
	}
	add(libvirtxml.NWFilterRule{Action: "drop", Direction: "out", Priority: prioL2Default,
		MAC: &libvirtxml.NWFilterRuleMAC{Comment: "every other frame"}})

	// IP layer: established and related both ways, and new connections
	// toward the machine, first.
	add(libvirtxml.NWFilterRule{Action: "accept", Direction: "inout", Priority: prioReplies,
		All: &libvirtxml.NWFilterRuleAll{Comment: "established and related", NWFilterRuleCommonIP: state("ESTABLISHED,RELATED")}})
	add(libvirtxml.NWFilterRule{Action: "accept", Direction: "inout", Priority: prioReplies,
		AllIPv6: &libvirtxml.NWFilterRuleAllIPv6{Comment: "established and related", NWFilterRuleCommonIP: state("ESTABLISHED,RELATED")}})
	add(libvirtxml.NWFilterRule{Action: "accept", Direction: "in", Priority: prioInbound,
		All: &libvirtxml.NWFilterRuleAll{Comment: "connections to the machine", NWFilterRuleCommonIP: state("NEW")}})
	add(libvirtxml.NWFilterRule{Action: "accept", Direction: "in", Priority: prioInbound,
		AllIPv6: &libvirtxml.NWFilterRuleAllIPv6{Comment: "connections to the machine", NWFilterRuleCommonIP: state("NEW")}})
	add(libvirtxml.NWFilterRule{Action: "accept", Direction: "out", Priority: prioAlways, StateMatch: "false",
		UDP: &libvirtxml.NWFilterRuleUDP{Comment: "DHCP client to server",
			NWFilterRuleCommonPort: libvirtxml.NWFilterRuleCommonPort{SrcPortStart: num(68), DstPortStart: num(67)}}})
	add(libvirtxml.NWFilterRule{Action: "accept", Direction: "out", Priority: prioAlways, StateMatch: "false",
		UDPIPv6: &libvirtxml.NWFilterRuleUDPIPv6{Comment: "DHCPv6 client to server",
			NWFilterRuleCommonPort: libvirtxml.NWFilterRuleCommonPort{SrcPortStart: num(546), DstPortStart: num(547)}}})
	for _, typ := range []int{133, 135, 136, 130, 131, 132, 143} {
		add(libvirtxml.NWFilterRule{Action: "accept", Direction: "out", Priority: prioAlways, StateMatch: "false",
			ICMPv6: &libvirtxml.NWFilterRuleICMPIPv6{Type: num(typ), Comment: "IPv6 neighbour discovery and MLD"}})
	}
	// libvirt mirrors every drop below into the other direction, without
	// state: ICMPv6 toward the machine (neighbour discovery, router
	// advertisements, from fe80:: sources, untracked) must pass first.
	add(libvirtxml.NWFilterRule{Action: "accept", Direction: "in", Priority: prioInbound, StateMatch: "false",
		ICMPv6: &libvirtxml.NWFilterRuleICMPIPv6{Comment: "ICMPv6 toward the machine"}})
	// The contract.
	for _, a := range opts.DNS {
		a = a.Unmap()
		action := "accept"
		if r.DNS == contract.DNSNone {
			action = "drop"
		}
		for _, p := range []Proto{TCP, UDP} {
			add(ipRule(action, prioDNS, netip.PrefixFrom(a, a.BitLen()), 53, p, dnsComment(r.DNS, a)))
		}
	}
	tuple := func(prio int, t Tuple) {
		for _, p := range []Proto{TCP, UDP} {
			if t.Protos&p != 0 {
				add(ipRule("accept", prio, t.Prefix, t.Port, p, allowComment(t)))
			}
		}
	}
	for _, t := range r.Allow {
		if t.LinkLocal() {
			tuple(prioLLAllow, t)
		}
	}
	for _, ll := range LinkLocal {
		add(allRule("drop", prioLLDrop, ll, "drop link-local "+ll.String()))
	}
	for _, t := range r.Allow {
		if !t.LinkLocal() {
			tuple(prioAllow, t)
		}
	}
	action := "drop"
	if r.Mode == contract.EgressAll {
		action = "accept"
	}
	for _, any := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
		add(allRule(action, prioDefault, any, defaultComment(r.Mode)))
	}
	out, err := f.Marshal()
	if err != nil {
		return "", fmt.Errorf("egress: nwfilter %s: %w", filterName, err)
	}
	return out + "\n", nil
}

func str(s string) libvirtxml.NWFilterField { return libvirtxml.NWFilterField{Str: s} }

func num(n int) libvirtxml.NWFilterField { return str(strconv.Itoa(n)) }

// dst is the destination match of a prefix; /0 matches all.
func dst(p netip.Prefix) libvirtxml.NWFilterRuleCommonIP {
	if p.Bits() == 0 {
		return libvirtxml.NWFilterRuleCommonIP{}
	}
	return libvirtxml.NWFilterRuleCommonIP{DstIPAddr: str(p.Masked().Addr().String()), DstIPMask: num(p.Bits())}
}

// state is an explicit state match. libvirt instantiates a rule that has
// one in its own direction only (a rule without one, also mirrored for the
// other direction, with the states of replies).
func state(s string) libvirtxml.NWFilterRuleCommonIP {
	return libvirtxml.NWFilterRuleCommonIP{State: str(s)}
}

// ipRule is a rule for TCP or UDP toward p (and port, 0 for any), out.
func ipRule(action string, prio int, p netip.Prefix, port uint16, proto Proto, comment string) libvirtxml.NWFilterRule {
	ports := libvirtxml.NWFilterRuleCommonPort{}
	if port != 0 {
		ports.DstPortStart = num(int(port))
	}
	r := libvirtxml.NWFilterRule{Action: action, Direction: "out", Priority: prio}
	switch {
	case proto == TCP && p.Addr().Is4():
		r.TCP = &libvirtxml.NWFilterRuleTCP{NWFilterRuleCommonIP: dst(p), NWFilterRuleCommonPort: ports, Comment: comment}
	case proto == TCP:
		r.TCPIPv6 = &libvirtxml.NWFilterRuleTCPIPv6{NWFilterRuleCommonIP: dst(p), NWFilterRuleCommonPort: ports, Comment: comment}
	case p.Addr().Is4():
		r.UDP = &libvirtxml.NWFilterRuleUDP{NWFilterRuleCommonIP: dst(p), NWFilterRuleCommonPort: ports, Comment: comment}
	default:
		r.UDPIPv6 = &libvirtxml.NWFilterRuleUDPIPv6{NWFilterRuleCommonIP: dst(p), NWFilterRuleCommonPort: ports, Comment: comment}
	}
	return r
}

// allRule is a rule for every IP packet toward p, out.
func allRule(action string, prio int, p netip.Prefix, comment string) libvirtxml.NWFilterRule {
	r := libvirtxml.NWFilterRule{Action: action, Direction: "out", Priority: prio}
	if p.Addr().Is4() {
		r.All = &libvirtxml.NWFilterRuleAll{NWFilterRuleCommonIP: dst(p), Comment: comment}
	} else {
		r.AllIPv6 = &libvirtxml.NWFilterRuleAllIPv6{NWFilterRuleCommonIP: dst(p), Comment: comment}
	}
	return r
}
