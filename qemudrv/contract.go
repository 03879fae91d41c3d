package qemudrv

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/contract"
	"github.com/vmfork/vmfork/egress"
)

// A machine's fork contract, the host's part (package egress): its egress
// rules live with its QEMU and its network, where the guest cannot reach.
//
//   - On QEMU's user network the guest's traffic leaves the host as the
//     QEMU process's own sockets: the QEMU starts inside a cgroup of the
//     machine's own (clone3 into it: no socket of it predates the rules),
//     and an inet table of the machine's filters that cgroup's sockets.
//     slirp's restrict=on is not used: it cannot pass a destination by its
//     real address or UDP, drops the DNS and the gateway of DHCP's answer,
//     and cannot be lifted on a running machine (egress.UserNetdevOptions
//     explains); the host's rules can be replaced in place.
//   - On a bridge, a bridge-family table of the machine's filters what its
//     tap sends into the bridge.
//   - A NIC with nothing behind it reaches nothing: nothing to enforce.
//
// The rules are applied before QEMU starts and removed when it is stopped
// (removeRuntimeFiles). Tables and cgroups are host-wide, and machine
// names unique only within a state dir: egressKey qualifies them.

var _ vmfork.Enforcer = (*Driver)(nil)

// compileTimeout bounds resolving a contract's host names.
const compileTimeout = 10 * time.Second

// egressKey names machine m's table and cgroup: its name and a digest of
// its state dir, so that machines of two state dirs never share one.
func egressKey(m *vmfork.Machine) string {
	sum := sha256.Sum256([]byte(filepath.Dir(filepath.Dir(m.Paths.Dir))))
	return m.Name + "-" + hex.EncodeToString(sum[:4])
}

// CheckContract implements vmfork.Enforcer.
func (d *Driver) CheckContract(ctx context.Context, m *vmfork.Machine, c *contract.Contract) error {
	if c == nil || c.Network == nil {
		return nil
	}
	var err error
	switch m.Spec.Network.Effective().Kind {
	case vmfork.NetworkUser:
		err = d.egress.CheckUser()
	case vmfork.NetworkBridge:
		err = d.egress.CheckBridge()
	default:
		return nil
	}
	if err != nil {
		return fmt.Errorf("network: %w: %w", err, vmfork.ErrUnsupported)
	}
	_, err = d.rulesFor(ctx, m, c)
	return err
}

// rulesFor compiles c's network part for machine m, with its secrets
// proxy (brokered.go) let through.
func (d *Driver) rulesFor(ctx context.Context, m *vmfork.Machine, c *contract.Contract) (egress.Rules, error) {
	ctx, cancel := context.WithTimeout(ctx, compileTimeout)
	defer cancel()
	r, err := egress.Compile(ctx, *c.Network, nil)
	if err != nil {
		return r, fmt.Errorf("%w: %w", err, vmfork.ErrInvalid)
	}
	if m.Broker != nil && r.Mode != contract.EgressAll {
		ap, err := netip.ParseAddrPort(m.Broker.Listen.Address)
		if err != nil {
			return r, fmt.Errorf("secrets proxy at %s: %w", m.Broker.Listen, err)
		}
		r.Mode = contract.EgressAllow
		r.Allow = append(r.Allow, egress.Tuple{Prefix: netip.PrefixFrom(ap.Addr(), ap.Addr().BitLen()), Port: ap.Port(), Protos: egress.TCP, From: "the secrets proxy"})
	}
	return r, nil
}

// egressBeforeStart readies machine m's rules before its QEMU starts: on
// the user network it makes the machine's cgroup and table, and returns
// the cgroup for QEMU to start in; on a bridge it returns the rules, to
// apply once the tap exists (tapRules). Without a contract network part,
// nothing.
func (d *Driver) egressBeforeStart(ctx context.Context, m *vmfork.Machine) (cg *egress.Cgroup, r *egress.Rules, err error) {
	if m.Contract == nil || m.Contract.Network == nil {
		return nil, nil, nil
	}
	kind := m.Spec.Network.Effective().Kind
	if kind != vmfork.NetworkUser && kind != vmfork.NetworkBridge {
		return nil, nil, nil
	}
	rules, err := d.rulesFor(ctx, m, m.Contract)
	if err != nil {
		return nil, nil, fmt.Errorf("machine %q: contract: %w", m.Name, err)
	}
	if kind == vmfork.NetworkBridge {
		return nil, &rules, nil
	}
	key := egressKey(m)
	if cg, err = egress.CreateCgroup(key); err != nil {
		return nil, nil, fmt.Errorf("machine %q: contract: %w", m.Name, err)
	}
	if err := d.egress.ApplyUser(key, egress.User{Cgroup: cg, Resolvers: hostResolvers()}, rules); err != nil {
		egress.RemoveCgroup(key)
		return nil, nil, fmt.Errorf("machine %q: contract: %w", m.Name, err)
	}
	return cg, &rules, nil
}

// tapRules applies rules r to machine m's tap on its bridge.
func (d *Driver) tapRules(m *vmfork.Machine, tap string, r egress.Rules) error {
	br := egress.Bridge{Tap: tap}
	if a, err := bridgeAddr(m.Spec.Network.Effective().Name); err == nil {
		br.DNS = []netip.Addr{a} // the bridge's own resolver (dnsmasq on its address)
	}
	if err := d.egress.ApplyBridge(egressKey(m), br, r); err != nil {
		return fmt.Errorf("machine %q: contract: %w", m.Name, err)
	}
	return nil
}

// hostResolvers are the host's resolvers, where slirp forwards a user
// network guest's DNS.
func hostResolvers() []netip.Addr {
	rs, _ := egress.ResolvConf("/etc/resolv.conf")
	return rs
}

// removeEgress removes machine m's rules and cgroup; idempotent. Called
// once its QEMU is gone.
func (d *Driver) removeEgress(m *vmfork.Machine) {
	key := egressKey(m)
	if err := d.egress.Remove(key); err != nil {
		d.log.WithField("machine", m.Name).WithError(err).Debug("egress rules not removed")
	}
	if err := egress.RemoveCgroup(key); err != nil && !errors.Is(err, egress.ErrUnavailable) {
		d.log.WithField("machine", m.Name).WithError(err).Debug("egress cgroup not removed")
	}
}

// ApplyContract implements vmfork.Enforcer: running machine m's rules
// become c's, replaced in one batch.
func (d *Driver) ApplyContract(ctx context.Context, m *vmfork.Machine, c *contract.Contract) error {
	kind := m.Spec.Network.Effective().Kind
	if kind != vmfork.NetworkUser && kind != vmfork.NetworkBridge {
		return nil
	}
	if c == nil || c.Network == nil {
		// Lifted: the machine reaches what its network reaches.
		return d.egress.Remove(egressKey(m))
	}
	rules, err := d.rulesFor(ctx, m, c)
	if err != nil {
		return err
	}
	key := egressKey(m)
	if kind == vmfork.NetworkBridge {
		tap, err := tapOf(m.PID)
		if err != nil {
			return fmt.Errorf("machine %q: %w", m.Name, err)
		}
		return d.tapRules(m, tap, rules)
	}
	cg, err := egress.OpenCgroup(key)
	if err != nil {
		// Started without a contract: its QEMU joins a cgroup now. Its
		// sockets made before keep their cgroup: the connections they
		// carry go on, as a narrowing --set's do (Enforcer's doc).
		if cg, err = egress.CreateCgroup(key); err != nil {
			return err
		}
		if err := cg.Add(m.PID); err != nil {
			return err
		}
	}
	return d.egress.ApplyUser(key, egress.User{Cgroup: cg, Resolvers: hostResolvers()}, rules)
}

// DescribeContract implements vmfork.Enforcer.
func (d *Driver) DescribeContract(ctx context.Context, m *vmfork.Machine) ([]string, error) {
	if m.Contract == nil || m.Contract.Network == nil {
		return nil, nil
	}
	lines, err := d.egress.List(egressKey(m))
	if err != nil {
		return nil, fmt.Errorf("machine %q: %w", m.Name, err)
	}
	return lines, nil
}

// tapOf returns the tap of QEMU process pid: the tun descriptor vmfork
// passed it (tapFD) names its interface in /proc/PID/fdinfo.
func tapOf(pid int) (string, error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "fdinfo", strconv.Itoa(tapFD)))
	if err != nil {
		return "", fmt.Errorf("find its tap: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "iff:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("find its tap: descriptor %d of pid %d is not a tap", tapFD, pid)
}
