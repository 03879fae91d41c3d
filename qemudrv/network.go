package qemudrv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork"
)

// The host side of a machine's NIC (vmfork.Network).
//
// On a bridge, vmfork itself creates the machine's tap (TUNSETIFF on
// /dev/net/tun), plugs it into the bridge, and hands QEMU the open
// descriptor (-netdev tap,fd=3). With CAP_NET_ADMIN it does not go through
// qemu-bridge-helper (without, it must: bridgehelper.go), because:
//   - the helper refuses every bridge that /etc/qemu/bridge.conf does not
//     "allow", a host file vmfork would have to own; vmfork already runs
//     with the privilege the helper's setuid bit stands in for;
//   - the tap is not persistent, so the kernel removes it when its last
//     descriptor closes: when QEMU exits, however it exits (kill -9
//     included), with nothing for vmfork to clean up or leak;
//   - QEMU opens no device and runs no helper or script, and the tap is
//     made in vmfork's own network namespace, next to the bridge vmfork
//     checked (`ip netns exec NS vmfork ...` works as expected).
//
// Every tap has IFF_VNET_HDR, so every machine on a bridge offers its guest
// the same NIC offloads: the device state of a source on a bridge only
// loads into a child whose NIC offers what the source's guest negotiated.

// tapFD is the tap's descriptor number in QEMU: the first of ExtraFiles.
const tapFD = 3

// tapPattern names taps; the kernel replaces %d with the first free number.
const tapPattern = "vmf%d"

var _ vmfork.NetworkChecker = (*Driver)(nil)

// CheckNetwork implements vmfork.NetworkChecker: the embedded driver has the
// user network, a bridge that exists in this network namespace, and none.
// Without CAP_NET_ADMIN a bridge is joined through qemu-bridge-helper
// (bridgehelper.go), which must be able to make the tap.
func (d *Driver) CheckNetwork(ctx context.Context, m *vmfork.Machine) error {
	n := m.Spec.Network.Effective()
	switch n.Kind {
	case vmfork.NetworkUser, vmfork.NetworkNone:
		return nil
	case vmfork.NetworkBridge:
		if err := vmfork.CheckBridge(n.Name); err != nil {
			return fmt.Errorf("machine %q: %w", m.Name, err)
		}
		if hasCap(unix.CAP_NET_ADMIN) {
			return nil
		}
		// Refused before anything is made: the helper would fail deep
		// in the start, after the disk and the journal.
		if _, err := bridgeHelper(n.Name); err != nil {
			return fmt.Errorf("machine %q: network %s: %w", m.Name, n, err)
		}
		return nil
	}
	return fmt.Errorf("machine %q: network %s: the embedded driver has user, bridge=BRIDGE and none; a libvirt network needs the libvirt driver (--connect): %w",
		m.Name, n, vmfork.ErrInvalid)
}

// hasCap reports whether this process has capability c in its effective
// set; a variable for tests.
var hasCap = func(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return true // unknown: let the tap's own error speak
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0
}

// spawnMachine starts QEMU for m with argv built for opt, after creating
// the tap it needs on a bridge and applying its contract's egress rules
// (contract.go). The tap lives exactly as long as QEMU; the rules until
// the machine is stopped.
func (d *Driver) spawnMachine(ctx context.Context, bin string, m *vmfork.Machine, opt ArgvOptions) (p *process, err error) {
	if err := m.PrepareLedgerSocket(); err != nil {
		return nil, err
	}
	cg, rules, err := d.egressBeforeStart(ctx, m)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && rules != nil {
			d.removeEgress(m)
		}
	}()
	so := spawnOptions{dieWithCLI: diesWithCLI(ctx)}
	if cg != nil {
		f, err := os.Open(cg.Path)
		if err != nil {
			return nil, fmt.Errorf("machine %q: contract: open its cgroup: %w", m.Name, err)
		}
		defer f.Close()
		so.cgroup = f
	}
	d.taps.Delete(m.Name)
	if n := m.Spec.Network.Effective(); n.Kind == vmfork.NetworkBridge {
		var tap *os.File
		var name string
		if hasCap(unix.CAP_NET_ADMIN) {
			tap, name, err = openTap(n.Name, m.Name)
		} else {
			var helper string
			if helper, err = bridgeHelper(n.Name); err == nil {
				tap, name, err = helperTap(ctx, helper, n.Name)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("machine %q: %w", m.Name, err)
		}
		d.taps.Store(m.Name, name)
		// QEMU gets its own copy; once ours is closed, QEMU's is the last.
		defer tap.Close()
		so.extra = append(so.extra, tap)
		d.log.WithFields(logrus.Fields{"machine": m.Name, "tap": name, "bridge": n.Name}).Debug("tap created")
		if rules != nil {
			if err := d.tapRules(m, name, *rules); err != nil {
				return nil, err
			}
		}
	}
	return d.procs.spawn(bin, Argv(m, opt), m.Paths.Log, so)
}

// openTap creates a tap, plugs it into bridge and sets it up. The returned
// file is the tap's only descriptor: closing it (here or in QEMU, the last
// one to hold it) removes the tap.
func openTap(bridge, machine string) (f *os.File, name string, err error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("create tap on bridge %q: open /dev/net/tun: %w", bridge, err)
	}
	f = os.NewFile(uintptr(fd), "/dev/net/tun")
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	ifr, err := unix.NewIfreq(tapPattern)
	if err != nil {
		return nil, "", err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return nil, "", fmt.Errorf("create tap on bridge %q: TUNSETIFF: %w", bridge, err)
	}
	name = ifr.Name()
	if err := plugIntoBridge(name, bridge); err != nil {
		return nil, "", fmt.Errorf("tap %s: %w", name, err)
	}
	// For whoever reads `ip link`: which machine the tap belongs to. It is
	// a label only, so failing to write it changes nothing.
	_ = os.WriteFile(filepath.Join("/sys/class/net", name, "ifalias"), []byte("vmfork "+machine), 0o644)
	return f, name, nil
}

// plugIntoBridge makes interface name a port of bridge and sets it up.
func plugIntoBridge(name, bridge string) error {
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket for interface ioctls: %w", err)
	}
	defer unix.Close(s)
	idx, err := ifIndex(s, name)
	if err != nil {
		return err
	}
	br, err := unix.NewIfreq(bridge)
	if err != nil {
		return err
	}
	br.SetUint32(uint32(idx))
	if err := unix.IoctlIfreq(s, unix.SIOCBRADDIF, br); err != nil {
		return fmt.Errorf("add to bridge %q: %w", bridge, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("read flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set up: %w", err)
	}
	return nil
}

func ifIndex(s int, name string) (int, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, fmt.Errorf("find interface index: %w", err)
	}
	return int(ifr.Uint32()), nil
}
