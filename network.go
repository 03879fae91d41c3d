package vmfork

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// NetworkKind says what a machine's NIC is plugged into on the host.
type NetworkKind string

// Network kinds.
const (
	// NetworkUser is QEMU's user-mode network: one private NAT network per
	// machine, where port forwards work. It is the default.
	NetworkUser NetworkKind = "user"
	// NetworkBridge is a tap on a host bridge, shared with everything else
	// on it. Each fork child gets a tap of its own on its source's bridge.
	NetworkBridge NetworkKind = "bridge"
	// NetworkLibvirt is a libvirt network (with its dnsmasq); only the
	// libvirt driver has it.
	NetworkLibvirt NetworkKind = "network"
	// NetworkNone is a NIC with nothing behind it on the host.
	NetworkNone NetworkKind = "none"
)

// Network is the host side of a machine's NIC. Fork children inherit their
// source's: the same bridge or libvirt network, each child with its own tap
// and, once its identity chain has run, its own MAC and lease.
type Network struct {
	Kind NetworkKind `json:"kind"`
	// Name is the bridge of NetworkBridge or the libvirt network of
	// NetworkLibvirt.
	Name string `json:"name,omitempty"`
}

// Effective returns n with the default filled in: a record written before
// networks had a kind is on the user-mode network.
func (n Network) Effective() Network {
	if n.Kind == "" {
		n.Kind = NetworkUser
	}
	return n
}

func (n Network) String() string {
	n = n.Effective()
	if n.Name != "" {
		return string(n.Kind) + "=" + n.Name
	}
	return string(n.Kind)
}

// ParseNetwork parses "user", "bridge=BR", "network=NET" or "none".
func ParseNetwork(s string) (Network, error) {
	kind, name, hasName := strings.Cut(strings.TrimSpace(s), "=")
	n := Network{Kind: NetworkKind(kind), Name: name}
	switch n.Kind {
	case NetworkUser, NetworkNone:
		if hasName {
			return n, fmt.Errorf("network %q: %s takes no name: %w", s, kind, ErrInvalid)
		}
	case NetworkBridge, NetworkLibvirt:
		if name == "" {
			return n, fmt.Errorf("network %q: want %s=NAME: %w", s, kind, ErrInvalid)
		}
		if !validIfName(name) {
			return n, fmt.Errorf("network %q: %q is not a valid interface or network name: %w", s, name, ErrInvalid)
		}
	default:
		return n, fmt.Errorf("network %q: want user, bridge=BRIDGE, network=NAME or none: %w", s, ErrInvalid)
	}
	return n, nil
}

// validIfName reports whether s can name a Linux network interface (and is
// a safe libvirt network name): at most 15 bytes, no slash, no whitespace.
func validIfName(s string) bool {
	if s == "" || len(s) > 15 || s == "." || s == ".." {
		return false
	}
	return !strings.ContainsAny(s, "/ \t\n:,=")
}

// sysClassNet is where the kernel lists the interfaces of the network
// namespace sysfs was mounted in (`ip netns exec` mounts its own).
var sysClassNet = "/sys/class/net"

// CheckBridge checks that bridge exists in this process's network namespace
// and is a bridge: the check a machine on it needs before anything starts
// or pauses, so that a missing bridge changes nothing.
func CheckBridge(bridge string) error {
	return checkBridgeIn(sysClassNet, interfaceExists, bridge)
}

// interfaceExists asks the kernel (netlink) rather than sysfs, which shows
// the namespace it was mounted in.
func interfaceExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

func checkBridgeIn(sys string, exists func(string) bool, bridge string) error {
	if !exists(bridge) {
		return fmt.Errorf("bridge %q does not exist (create it, e.g. `ip link add %s type bridge`): %w", bridge, bridge, ErrInvalid)
	}
	_, err := os.Stat(filepath.Join(sys, bridge, "bridge"))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("interface %q is not a bridge: %w", bridge, ErrInvalid)
	}
	if err != nil {
		return fmt.Errorf("bridge %q: %w", bridge, asInvalid(err))
	}
	return nil
}

// validateNetwork checks what a spec's network can be checked for without
// a driver.
func (s *Spec) validateNetwork() error {
	n := s.Network.Effective()
	if _, err := ParseNetwork(n.String()); err != nil {
		return err
	}
	if len(s.Ports) > 0 && n.Kind != NetworkUser {
		return fmt.Errorf("port forwards need the user network, not %s: reach a machine on a bridge at its own address: %w", n, ErrInvalid)
	}
	return nil
}
