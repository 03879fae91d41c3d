package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/contract"
)

// Bridge is a machine's place on a bridge.
type Bridge struct {
	// Tap is the machine's tap, a port of the bridge.
	Tap string
	// DNS is the addresses DNS may go to under DNS host (dropped under
	// DNS none): the bridge's own DNS server, dnsmasq on the bridge's
	// address.
	DNS []netip.Addr
}

// Reply tracking. The bridge family has no conntrack on this kind of
// kernel: `ct` in a bridge table needs nf_conntrack_bridge
// (CONFIG_NF_CONNTRACK_BRIDGE, Linux 5.3+), which many kernels, this
// project's test host's among them, do not build, and then nftables
// refuses the rule (EPROTO). Filtering only connection-opening packets
// (TCP SYN without ACK) instead would leave a way out: a guest may send
// any non-SYN TCP segment, payload and all, to any address, and a host
// that masquerades the bridge picks such segments up as connections
// (nf_conntrack_tcp_loose). So the table keeps its own small conntrack:
// every TCP segment and UDP datagram the bridge sends *to* the tap records
// (peer address, peer port, machine port) in a set with a timeout, and a
// packet *from* the tap that matches a recorded flow is a reply and
// passes. A guest cannot record a flow itself: only packets toward it do.
// Replacing the table in place empties the sets; a flow's next packet
// toward the machine records it again.
const (
	// tcpReplyTimeout is how long an idle TCP flow toward the machine
	// stays open to replies: long, as conntrack's 5 days for an
	// established connection, but bounded.
	tcpReplyTimeout = 24 * time.Hour
	// udpReplyTimeout is conntrack's for a UDP stream (180 s).
	udpReplyTimeout = 3 * time.Minute
	// replySetSize bounds each set: a flood toward the machine fills it,
	// and then new flows' replies are dropped, nothing worse.
	replySetSize = 65536
)

// bridgePriority is nft's "filter" priority in the bridge family.
const bridgePriority = -200

// ApplyBridge enforces r on the frames machine's tap sends into its
// bridge: a bridge-family table of its own, made (or replaced) in one
// netlink batch, so the machine is never without rules in between. It
// lets through ARP, DHCP and DHCPv6 client to server, IPv6 neighbour
// discovery and MLD, and replies on flows toward the machine (see the
// reply tracking above), then applies r (Rules' order) with br.DNS as the
// DNS addresses. Everything that is not ARP, IPv4 or IPv6 is dropped
// under every mode (a VLAN-tagged frame would carry IP past the rules).
// Errors name the machine or the tap; an error that says the kernel cannot
// do it wraps ErrUnavailable.
func (h Host) ApplyBridge(machine string, br Bridge, r Rules) error {
	if err := checkMachine(machine); err != nil {
		return err
	}
	if err := checkRules(r); err != nil {
		return err
	}
	if err := h.checkBridgePort(br.Tap); err != nil {
		return fmt.Errorf("egress: machine %s: %w", machine, err)
	}
	c, done, err := h.conn()
	if err != nil {
		return err
	}
	defer done()
	t := &nftables.Table{Name: TableName(machine), Family: nftables.TableFamilyBridge}
	// add, delete, add: the kernel applies the batch whole, so a table
	// that exists is replaced and one that does not is made.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	buildBridge(c, t, br, r)
	return flush(c, fmt.Sprintf("apply machine %s's rules to tap %s", machine, br.Tap))
}

// CheckBridge reports whether this kernel can enforce a contract on a
// bridge: it sends a batch that makes a table like ApplyBridge's and
// deletes it again, so the kernel checks every expression and nothing
// stays. Call it before anything is paused.
func (h Host) CheckBridge() error {
	c, done, err := h.conn()
	if err != nil {
		return err
	}
	defer done()
	t := &nftables.Table{Name: fmt.Sprintf("vmfork-probe-%d", os.Getpid()), Family: nftables.TableFamilyBridge}
	c.AddTable(t)
	buildBridge(c, t, Bridge{Tap: "vmfork-probe", DNS: []netip.Addr{netip.IPv4Unspecified()}}, probeRules)
	c.DelTable(t)
	return flush(c, "probe bridge filtering")
}

// probeRules use every kind of rule a contract can make.
var probeRules = Rules{
	Mode: contract.EgressAllow, DNS: contract.DNSHost,
	Allow: []Tuple{
		{Prefix: netip.MustParsePrefix("169.254.169.254/32"), Port: 80, Protos: TCP | UDP},
		{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Protos: TCP | UDP},
		{Prefix: netip.MustParsePrefix("2001:db8::/32"), Port: 443, Protos: TCP | UDP},
	},
}

func checkRules(r Rules) error {
	switch r.Mode {
	case contract.EgressAll, contract.EgressNone, contract.EgressAllow:
	default:
		return fmt.Errorf("egress: rules have mode %q (use Compile): %w", r.Mode, contract.ErrInvalid)
	}
	switch r.DNS {
	case contract.DNSHost, contract.DNSNone:
	default:
		return fmt.Errorf("egress: rules have DNS %q (use Compile): %w", r.DNS, contract.ErrInvalid)
	}
	return nil
}

// replySet is one of the reply-tracking sets.
type replySet struct {
	v       int
	proto   Proto
	timeout time.Duration
	set     *nftables.Set
}

func (s replySet) name() string { return fmt.Sprintf("reply%d%s", s.v, s.proto) }

// registers for a (address, port, port) key: nft puts each part of a
// concatenation in the next 32-bit register, the address in register 1
// (32-bit registers 8 to 11).
func (s replySet) portRegs() (uint32, uint32) {
	if s.v == 4 {
		return 9, 10
	}
	return 12, 13
}

func buildBridge(c *nftables.Conn, t *nftables.Table, br Bridge, r Rules) {
	var sets []replySet
	for _, v := range []int{4, 6} {
		addr := nftables.TypeIPAddr
		if v == 6 {
			addr = nftables.TypeIP6Addr
		}
		for _, p := range []Proto{TCP, UDP} {
			s := replySet{v: v, proto: p, timeout: tcpReplyTimeout}
			if p == UDP {
				s.timeout = udpReplyTimeout
			}
			s.set = &nftables.Set{
				Table: t, Name: s.name(), Concatenation: true, Dynamic: true,
				HasTimeout: true, Timeout: s.timeout, Size: replySetSize,
				KeyType: nftables.MustConcatSetType(addr, nftables.TypeInetService, nftables.TypeInetService),
			}
			if err := c.AddSet(s.set, nil); err != nil {
				panic(err) // only for anonymous sets
			}
			sets = append(sets, s)
		}
	}
	policy := nftables.ChainPolicyAccept
	pre := c.AddChain(&nftables.Chain{
		Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter, Policy: &policy,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(bridgePriority),
	})
	post := c.AddChain(&nftables.Chain{
		Name: "postrouting", Table: t, Type: nftables.ChainTypeFilter, Policy: &policy,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityRef(bridgePriority),
	})
	from := c.AddChain(&nftables.Chain{Name: "from_child", Table: t})
	to := c.AddChain(&nftables.Chain{Name: "to_child", Table: t})
	fam := nftables.TableFamilyBridge
	rules{c, t, pre}.add("frames from tap "+br.Tap+": from_child", jump(from.Name), ifname(expr.MetaKeyIIFNAME, br.Tap)...)
	rules{c, t, post}.add("frames to tap "+br.Tap+": to_child", jump(to.Name), ifname(expr.MetaKeyOIFNAME, br.Tap)...)

	toChild := rules{c, t, to}
	for _, s := range sets {
		a, n := addrOffset(s.v, false)
		sreg, dreg := s.portRegs()
		toChild.add(fmt.Sprintf("record ipv%d %s flows toward the machine (peer . peer port . machine port)", s.v, s.proto),
			&expr.Dynset{SrcRegKey: 1, SetName: s.set.Name, SetID: s.set.ID, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: s.timeout},
			cat(matchIP(fam, s.v), toChild.l4(s.proto), []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: a, Len: n},
				&expr.Payload{DestRegister: sreg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
				&expr.Payload{DestRegister: dreg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			})...)
	}

	fc := rules{c, t, from}
	fc.add("accept ARP", accept, etherType(unix.ETH_P_ARP)...)
	fc.add("accept DHCP client to server (udp 68 to 67)", accept, cat(matchIP(fam, 4), fc.l4(UDP), port(false, 68), port(true, 67))...)
	fc.add("accept DHCPv6 client to server (udp 546 to 547)", accept, cat(matchIP(fam, 6), fc.l4(UDP), port(false, 546), port(true, 547))...)
	// Neighbour discovery and MLD are link-local by protocol: their
	// receivers discard them unless the hop limit is 255 (ND, RFC 4861)
	// or 1 (MLD), which no router forwards unchanged.
	icmp6 := func(hops byte, types ...byte) []expr.Any {
		return cat(matchIP(fam, 6), []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 7, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{hops}},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			fc.anonSet(nftables.TypeICMP6Type, types...),
		})
	}
	fc.add("accept IPv6 neighbour discovery (ICMPv6 133, 135, 136, hop limit 255)", accept, icmp6(255, 133, 135, 136)...)
	fc.add("accept MLD (ICMPv6 130, 131, 132, 143, hop limit 1)", accept, icmp6(1, 130, 131, 132, 143)...)
	for _, s := range sets {
		a, n := addrOffset(s.v, true)
		dreg, sreg := s.portRegs()
		fc.add(fmt.Sprintf("accept replies on recorded ipv%d %s flows", s.v, s.proto), accept,
			cat(matchIP(fam, s.v), fc.l4(s.proto), []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: a, Len: n},
				&expr.Payload{DestRegister: dreg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Payload{DestRegister: sreg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
				&expr.Lookup{SourceRegister: 1, SetName: s.set.Name, SetID: s.set.ID},
			})...)
	}
	fc.addPolicy(fam, r, br.DNS)
	if r.Mode == contract.EgressAll {
		fc.add("accept other IPv4 (egress: all)", accept, matchIP(fam, 4)...)
		fc.add("accept other IPv6 (egress: all)", accept, matchIP(fam, 6)...)
		fc.add("drop everything else (not ARP, IPv4 or IPv6)", drop)
		return
	}
	fc.add(defaultComment(r.Mode), drop)
}

// checkBridgePort reports whether tap exists in h's namespace and is a
// port of a bridge: bridge-family rules see no other interface's frames.
func (h Host) checkBridgePort(tap string) error {
	if tap == "" || len(tap) >= unix.IFNAMSIZ {
		return fmt.Errorf("tap %q is not an interface name", tap)
	}
	cfg := &netlink.Config{}
	if h.NetNS != "" {
		f, err := os.Open(h.NetNS)
		if err != nil {
			return fmt.Errorf("network namespace: %w", err)
		}
		defer f.Close()
		cfg.NetNS = int(f.Fd())
	}
	conn, err := netlink.Dial(unix.NETLINK_ROUTE, cfg)
	if err != nil {
		return fmt.Errorf("look up tap %s: %w", tap, err)
	}
	defer conn.Close()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.IFLA_IFNAME, tap)
	attrs, err := ae.Encode()
	if err != nil {
		return fmt.Errorf("look up tap %s: %w", tap, err)
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request},
		Data:   append(make([]byte, unix.SizeofIfInfomsg), attrs...),
	})
	if errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("tap %s does not exist", tap)
	}
	if err != nil {
		return fmt.Errorf("look up tap %s: %w", tap, err)
	}
	if len(msgs) != 1 || len(msgs[0].Data) < unix.SizeofIfInfomsg {
		return fmt.Errorf("look up tap %s: unexpected answer", tap)
	}
	if slaveKind(msgs[0].Data[unix.SizeofIfInfomsg:]) != "bridge" {
		return fmt.Errorf("tap %s is not a port of a bridge: bridge rules would never see its frames", tap)
	}
	return nil
}

// slaveKind is IFLA_LINKINFO's IFLA_INFO_SLAVE_KIND: "bridge" for a
// bridge's port.
func slaveKind(attrs []byte) string {
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return ""
	}
	kind := ""
	for ad.Next() {
		if ad.Type() != unix.IFLA_LINKINFO {
			continue
		}
		ad.Nested(func(nad *netlink.AttributeDecoder) error {
			for nad.Next() {
				if nad.Type() == unix.IFLA_INFO_SLAVE_KIND {
					kind = nad.String()
				}
			}
			return nil
		})
	}
	return kind
}
