package customize

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// NetworkMode says how a child gets its addresses once it has its own MAC.
type NetworkMode string

// Network modes.
const (
	NetworkDHCP   NetworkMode = "dhcp"   // renew the DHCP lease (the default)
	NetworkStatic NetworkMode = "static" // one address per child from the spec
	NetworkNone   NetworkMode = "none"   // only the MAC changes
)

// NetworkSpec configures the network step.
type NetworkSpec struct {
	// Mode defaults to static when Addresses are given, else dhcp.
	Mode NetworkMode `json:"mode,omitempty" yaml:"mode,omitempty"`
	// Interface is the guest's NIC; by default the one non-loopback
	// interface, or the one with the source's MAC.
	Interface string `json:"interface,omitempty" yaml:"interface,omitempty"`
	// Addresses are static addresses in CIDR form, one per child in the
	// order of the fork (child n gets the n-th).
	Addresses []string `json:"addresses,omitempty" yaml:"addresses,omitempty"`
	Gateway   string   `json:"gateway,omitempty" yaml:"gateway,omitempty"`
	DNS       []string `json:"dns,omitempty" yaml:"dns,omitempty"`
	// DHCPCommand replaces the DHCP client vmfork finds in the guest
	// (udhcpc, dhcpcd or dhclient); "{interface}" in it is replaced.
	DHCPCommand []string `json:"dhcp_command,omitempty" yaml:"dhcp_command,omitempty"`
}

// EffectiveMode returns the mode, filling in the default.
func (n NetworkSpec) EffectiveMode() NetworkMode {
	switch {
	case n.Mode != "":
		return n.Mode
	case len(n.Addresses) > 0:
		return NetworkStatic
	}
	return NetworkDHCP
}

func (n NetworkSpec) validate() error {
	mode := n.EffectiveMode()
	switch mode {
	case NetworkDHCP, NetworkStatic, NetworkNone:
	default:
		return fmt.Errorf("network mode %q: want dhcp, static or none", n.Mode)
	}
	if mode == NetworkStatic && len(n.Addresses) == 0 {
		return fmt.Errorf("network mode static needs addresses")
	}
	if mode != NetworkStatic && (len(n.Addresses) > 0 || n.Gateway != "" || len(n.DNS) > 0) {
		return fmt.Errorf("network addresses, gateway and dns need mode static, not %s", mode)
	}
	if len(n.DHCPCommand) > 0 && mode != NetworkDHCP {
		return fmt.Errorf("network dhcp_command needs mode dhcp, not %s", mode)
	}
	if n.Interface != "" && !validIfName(n.Interface) {
		return fmt.Errorf("network interface %q is not a valid interface name", n.Interface)
	}
	seen := map[netip.Addr]bool{}
	for _, a := range n.Addresses {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return fmt.Errorf("network address %q: want an address with a prefix length, such as 10.0.2.21/24", a)
		}
		if seen[p.Addr()] {
			return fmt.Errorf("network address %s is given twice", p.Addr())
		}
		seen[p.Addr()] = true
	}
	if n.Gateway != "" {
		if _, err := netip.ParseAddr(n.Gateway); err != nil {
			return fmt.Errorf("network gateway %q is not an IP address", n.Gateway)
		}
	}
	for _, d := range n.DNS {
		if _, err := netip.ParseAddr(d); err != nil {
			return fmt.Errorf("network dns %q is not an IP address", d)
		}
	}
	return nil
}

func validIfName(s string) bool {
	if s == "" || len(s) > 15 {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == '/' || r == ':' || r > '~' {
			return false
		}
	}
	return true
}

// NetworkStep gives the guest its new MAC, then its addresses as n says.
// The MAC changes inside the guest (virtio-net's control queue), so QEMU's
// receive filter follows it; the NIC's MAC in QEMU's configuration must
// stay the template's.
func NetworkStep(n NetworkSpec) Step {
	return Step{Name: StepNetwork, Timeout: networkTimeout, Fn: n.apply}
}

func (n NetworkSpec) apply(ctx context.Context, env *Env) error {
	c := env.Child
	if _, err := net.ParseMAC(c.MAC); err != nil || c.MAC == "" {
		return fmt.Errorf("no valid MAC chosen for the child (%q)", c.MAC)
	}
	mode := n.EffectiveMode()
	var addr string
	if mode == NetworkStatic {
		if c.Index < 1 || c.Index > len(n.Addresses) {
			return fmt.Errorf("no static address for child %d: the spec lists %d", c.Index, len(n.Addresses))
		}
		addr = n.Addresses[c.Index-1]
	}
	nic := n.Interface
	if nic == "" {
		var err error
		if nic, err = findNIC(ctx, env.Agent, c.OldMACs); err != nil {
			return err
		}
	}
	if _, err := shell(ctx, env.Agent, "set MAC", macScript, nic, c.MAC, string(mode), addr, n.Gateway, strings.Join(n.DNS, " ")); err != nil {
		return err
	}
	env.Result.MAC = c.MAC
	if mode == NetworkDHCP {
		// DHCP needs the link, which the caller holds down until the chain
		// ends. The guest has its own MAC now, so it may go out.
		if env.Link != nil {
			if err := env.Link.SetLink(ctx, true); err != nil {
				return fmt.Errorf("raise the link for DHCP: %w", err)
			}
		}
		if err := n.dhcp(ctx, env.Agent, nic); err != nil {
			return err
		}
	}
	addrs, err := addressesOf(ctx, env.Agent, nic)
	if err != nil {
		return err
	}
	env.Result.Addresses = addrs
	env.Detailf("%s %s, %s: %s", nic, c.MAC, mode, orNone(strings.Join(addrs, " ")))
	return nil
}

// macScript gives interface $1 the MAC $2, then the addresses mode $3
// wants. Down, new MAC, up: the kernel derives new IPv6 link-local
// addresses from the new MAC when the link comes up, instead of keeping the
// parent's; "address X up" sets the address before the flags, in both
// busybox's ip and iproute2's (the kernel's do_setlink). IPv4 addresses
// survive that, routes through the interface do not, so mode none puts the
// default routes back. Each ip costs tens of milliseconds in a fresh child
// under TCG, so only mode none reads the routes.
const macScript = `set -e
nic=$1 mac=$2 mode=$3 addr=$4 gw=$5 dns=$6
routes=
if [ "$mode" = none ]; then routes=$(ip -4 route show default dev "$nic" 2>/dev/null || true); fi
ip link set dev "$nic" down
ip link set dev "$nic" address "$mac" up
case $mode in
static)
	case $addr in *:*) fam=-6 ;; *) fam=-4 ;; esac
	ip "$fam" addr flush dev "$nic" scope global
	ip addr add "$addr" dev "$nic"
	if [ -n "$gw" ]; then ip route replace default via "$gw" dev "$nic"; fi
	if [ -n "$dns" ]; then
		for s in $dns; do echo "nameserver $s"; done >/etc/resolv.conf.vmfork
		cat /etc/resolv.conf.vmfork >/etc/resolv.conf
		rm -f /etc/resolv.conf.vmfork
	fi
	;;
none)
	printf '%s\n' "$routes" | while read -r r; do
		if [ -n "$r" ]; then ip route replace $r dev "$nic"; fi
	done
	;;
esac`

// dhcpScript asks the guest's DHCP client for a lease on $1 and returns
// once it has one.
//
// busybox's udhcpc applies a lease only through its event script, whose
// default path differs between builds (Debian: /etc/udhcpc), so the one
// that exists is named.
const dhcpScript = `nic=$1
if command -v udhcpc >/dev/null 2>&1; then
	for s in /etc/udhcpc/default.script /usr/share/udhcpc/default.script ""; do
		if [ -z "$s" ] || [ -x "$s" ]; then break; fi
	done
	exec udhcpc -i "$nic" -n -q -t 5 -T 1 ${s:+-s "$s"}
elif command -v dhcpcd >/dev/null 2>&1; then
	exec dhcpcd -n -w "$nic"
elif command -v dhclient >/dev/null 2>&1; then
	dhclient -r "$nic" >/dev/null 2>&1 || true
	exec dhclient -1 "$nic"
fi
echo "no DHCP client in the guest (udhcpc, dhcpcd or dhclient); set network.dhcp_command" >&2
exit 1`

func (n NetworkSpec) dhcp(ctx context.Context, a Agent, nic string) error {
	if len(n.DHCPCommand) == 0 {
		_, err := shell(ctx, a, "renew DHCP lease", dhcpScript, nic)
		return err
	}
	argv := make([]string, len(n.DHCPCommand))
	for i, s := range n.DHCPCommand {
		argv[i] = strings.ReplaceAll(s, "{interface}", nic)
	}
	st, err := runGuest(ctx, a, argv[0], argv[1:], nil)
	if err != nil {
		return fmt.Errorf("renew DHCP lease: %w", err)
	}
	return exitErr("dhcp_command "+argv[0], st)
}

// findNIC returns the guest's NIC: its only non-loopback interface, or the
// one with one of the MACs the child inherited.
func findNIC(ctx context.Context, a Agent, old []string) (string, error) {
	ifs, err := a.NetworkInterfaces(ctx)
	if err != nil {
		return "", fmt.Errorf("list guest interfaces: %w", err)
	}
	var cands []string
	for _, i := range ifs {
		if i.Name == "lo" || i.HardwareAddress == "" || i.HardwareAddress == "00:00:00:00:00:00" {
			continue
		}
		for _, m := range old {
			if strings.EqualFold(i.HardwareAddress, m) {
				return i.Name, nil
			}
		}
		cands = append(cands, i.Name)
	}
	switch len(cands) {
	case 1:
		return cands[0], nil
	case 0:
		return "", fmt.Errorf("the guest has no network interface")
	}
	return "", fmt.Errorf("the guest has several network interfaces (%s); set network.interface", strings.Join(cands, ", "))
}

// addressesOf returns nic's addresses in CIDR form, without link-local ones.
func addressesOf(ctx context.Context, a Agent, nic string) ([]string, error) {
	ifs, err := a.NetworkInterfaces(ctx)
	if err != nil {
		return nil, fmt.Errorf("list guest interfaces: %w", err)
	}
	var out []string
	for _, i := range ifs {
		if i.Name != nic {
			continue
		}
		for _, ip := range i.IPAddresses {
			addr, err := netip.ParseAddr(ip.Address)
			if err != nil || addr.IsLinkLocalUnicast() {
				continue
			}
			out = append(out, netip.PrefixFrom(addr, ip.Prefix).String())
		}
	}
	return out, nil
}

// ChildMAC returns the MAC for the index-th child of a fork: QEMU's
// 52:54:00 prefix and 24 bits that follow from seed (the template's
// identity) and the index, so siblings never share one. Any MAC in avoid
// (the source's) is stepped over.
func ChildMAC(seed []byte, index int, avoid ...string) string {
	sum := sha256.Sum256(seed)
	base := binary.BigEndian.Uint32(sum[:4])
	for k := uint32(0); ; k++ {
		v := (base + uint32(index) + k<<20) & 0xffffff
		mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", byte(v>>16), byte(v>>8), byte(v))
		clash := false
		for _, a := range avoid {
			clash = clash || strings.EqualFold(a, mac)
		}
		if !clash {
			return mac
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "no address"
	}
	return s
}
