package customize

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/vmfork/vmfork/qmp"
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

// NetworkStep gives the guest its new MAC, then its addresses as n says,
// and leaves it nothing of its source's network identity: the inherited
// DHCP client is stopped without a DHCPRELEASE (the lease is the parent's,
// and the link is down, so nothing leaves the child anyway), the inherited
// addresses are flushed and the lease files (and dhclient's DUID) emptied,
// and a fresh exchange runs with the new MAC and, for systemd-networkd, the
// client identifier of the new machine-id. Afterwards the NIC has exactly
// one IPv4 address, announced with a gratuitous ARP. The MAC changes inside
// the guest (virtio-net's control queue), so QEMU's receive filter follows
// it; the NIC's MAC in QEMU's configuration must stay the template's.
//
// What renews the lease is what configured the NIC before: NetworkManager,
// systemd-networkd, or the DHCP client that ran (dhclient, as ifupdown starts
// it, udhcpc or dhcpcd), restarted with its own command line; a guest where
// none runs (a DHCP client that quit after its lease, as the test guest's
// udhcpc -q) gets udhcpc -q, dhclient or dhcpcd, whichever it has. The
// step's detail names the mechanism.
func NetworkStep(n NetworkSpec) Step {
	return Step{Name: StepNetwork, Timeout: networkTimeout, Parts: n.parts}
}

func (n NetworkSpec) parts(ctx context.Context, env *Env) ([]*Part, error) {
	c := env.Child
	if _, err := net.ParseMAC(c.MAC); err != nil || c.MAC == "" {
		return nil, fmt.Errorf("no valid MAC chosen for the child (%q)", c.MAC)
	}
	mode := n.EffectiveMode()
	var addr string
	if mode == NetworkStatic {
		if c.Index < 1 || c.Index > len(n.Addresses) {
			return nil, fmt.Errorf("no static address for child %d: the spec lists %d", c.Index, len(n.Addresses))
		}
		addr = n.Addresses[c.Index-1]
	}
	nic, factMAC := n.Interface, ""
	if nic == "" {
		var ok bool
		if nic, factMAC, ok = factNIC(env.Facts, c.OldMACs); !ok {
			var err error
			if nic, err = findNIC(ctx, env.Agent, c.OldMACs); err != nil {
				return nil, err
			}
		}
	}
	var dhcp *DHCPFacts
	if env.Facts != nil {
		dhcp = env.Facts.DHCP
	}
	var cmdline string
	if dhcp != nil {
		cmdline = strings.Join(dhcp.Cmdline, " ")
	}
	env.mac = c.MAC
	custom := "0"
	if len(n.DHCPCommand) > 0 {
		custom = "1"
	}
	var down string
	// scripts/network-down.sh and network-up.sh say what each argument is.
	first := &Part{
		Script: netDownScript,
		Args:   []string{nic, c.MAC, string(mode), addr, n.Gateway, strings.Join(n.DNS, " "), custom, factMAC, dhcp.arg(), cmdline},
		Done: func(env *Env, out string) error {
			down = strings.TrimSpace(out)
			env.Result.MAC = c.MAC
			if mode != NetworkDHCP {
				return n.finish(ctx, env, nic, mode, down)
			}
			return nil
		},
	}
	if mode != NetworkDHCP {
		return []*Part{first}, nil
	}
	wait := networkTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	args := []string{nic, c.MAC, strconv.Itoa(max(1, int(wait.Seconds())-1))}
	for _, s := range n.DHCPCommand {
		args = append(args, strings.ReplaceAll(s, "{interface}", nic))
	}
	// DHCP needs the link, which the caller holds down until the chain
	// ends. The guest has its own MAC now, so it may go out.
	second := &Part{
		Script: netUpScript,
		Args:   args,
		LinkUp: true,
		Done: func(env *Env, out string) error {
			return n.finish(ctx, env, nic, mode, down+"; "+strings.TrimSpace(out))
		},
	}
	return []*Part{first, second}, nil
}

// finish records the NIC's addresses and checks that it has exactly one
// IPv4 address in modes that give it one.
func (n NetworkSpec) finish(ctx context.Context, env *Env, nic string, mode NetworkMode, how string) error {
	addrs, err := addressesOf(context.WithoutCancel(ctx), env.Agent, nic)
	if err != nil {
		return err
	}
	env.Result.Addresses = addrs
	if mode != NetworkNone {
		var v4 []string
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a); err == nil && p.Addr().Is4() {
				v4 = append(v4, a)
			}
		}
		if len(v4) != 1 {
			return fmt.Errorf("%s has %d IPv4 addresses after the network step (%s), want exactly one", nic, len(v4), orNone(strings.Join(v4, " ")))
		}
	}
	env.Detailf("%s %s, %s: %s (%s)", nic, env.Child.MAC, mode, orNone(strings.Join(addrs, " ")), how)
	return nil
}

// findNIC returns the guest's NIC: its only non-loopback interface, or the
// one with one of the MACs the child inherited.
func findNIC(ctx context.Context, a Agent, old []string) (string, error) {
	nic, _, err := findNICMAC(ctx, a, old)
	return nic, err
}

// findNICMAC is findNIC that also returns the NIC's MAC.
func findNICMAC(ctx context.Context, a Agent, old []string) (string, string, error) {
	ifs, err := a.NetworkInterfaces(ctx)
	if err != nil {
		return "", "", fmt.Errorf("list guest interfaces: %w", err)
	}
	var cands []qmp.NetworkInterface
	for _, i := range ifs {
		if i.Name == "lo" || i.HardwareAddress == "" || i.HardwareAddress == "00:00:00:00:00:00" {
			continue
		}
		for _, m := range old {
			if strings.EqualFold(i.HardwareAddress, m) {
				return i.Name, strings.ToLower(i.HardwareAddress), nil
			}
		}
		cands = append(cands, i)
	}
	switch len(cands) {
	case 1:
		return cands[0].Name, strings.ToLower(cands[0].HardwareAddress), nil
	case 0:
		return "", "", fmt.Errorf("the guest has no network interface")
	}
	names := make([]string, len(cands))
	for i, c := range cands {
		names[i] = c.Name
	}
	return "", "", fmt.Errorf("the guest has several network interfaces (%s); set network.interface", strings.Join(names, ", "))
}

// factNIC returns the NIC the facts name and the MAC it had there, when
// that MAC is one the child may have.
func factNIC(f *Facts, old []string) (string, string, bool) {
	if f == nil || f.NIC == nil || f.NIC.Name == "" {
		return "", "", false
	}
	for _, m := range old {
		if strings.EqualFold(m, f.NIC.MAC) {
			return f.NIC.Name, strings.ToLower(f.NIC.MAC), true
		}
	}
	return "", "", false
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
