package broker

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vmfork/vmfork/contract"
)

// Addr is where a child's proxy listens, on the host.
type Addr struct {
	// Network is "tcp" or "unix".
	Network string `json:"network"`
	// Address is HOST:PORT for tcp (port 0: the broker picks one, and
	// Register returns it) or a socket's path for unix.
	Address string `json:"address"`
}

func (a Addr) String() string { return a.Network + ":" + a.Address }

// Binding is one brokered secret of a child.
type Binding struct {
	// Name is the secret's name in the contract.
	Name string `json:"name"`
	// Secret is its spec: hosts, header, format and value_from.
	Secret contract.Secret `json:"secret"`
	// Placeholder is what the child holds instead (NewPlaceholder).
	Placeholder string `json:"placeholder"`
	// Value is the child's value (Resolve). It travels only over the
	// broker's control socket and lives only in the broker's memory: the
	// broker's registry file never holds it. Nil asks the broker to
	// resolve an exec or file value itself; a secret with neither (an env
	// value the broker cannot see) is refused.
	Value []byte `json:"value,omitempty"`
}

// Child is a machine registered with the broker: who it is, where its
// proxy listens, what it may reach and its secrets.
type Child struct {
	ChildInfo
	// Listen is where its proxy listens. Whoever connects there is taken
	// to be this machine: it must be reachable by this machine only (a
	// unix socket its QEMU's guestfwd connects to), or AllowFrom must
	// name the machine's own addresses.
	Listen Addr `json:"listen"`
	// AllowFrom, for a tcp listener, are the source addresses accepted;
	// a connection from elsewhere is closed unanswered. Empty: any.
	AllowFrom []netip.Prefix `json:"allow_from,omitempty"`
	// Egress is what the machine may reach through its proxy (nil: all).
	// It should be the machine's own contract's: the proxy never lets a
	// machine reach what its network would not (see egressAllows).
	Egress *contract.Egress `json:"egress,omitempty"`
	// PID is the machine's QEMU, if known: the broker drops the machine
	// once that process is gone, should nobody unregister it.
	PID int `json:"pid,omitempty"`
	// FromPID accepts a tcp connection only when its other end is a
	// socket held by process PID (peer.go). A machine on QEMU's user
	// network reaches its proxy through the host's loopback, where every
	// such machine comes from 127.0.0.1: its QEMU is what tells it apart.
	// Until PID is known, nothing is accepted.
	FromPID bool `json:"from_pid,omitempty"`
	// Secrets are its brokered secrets.
	Secrets []Binding `json:"secrets"`
}

// validate checks c and fills in the secrets' defaults (header
// Authorization, format {value}, lower-case hosts), as the contract does.
func (c *Child) validate() error {
	if c.Name == "" {
		return fmt.Errorf("broker: machine with no name: %w", contract.ErrInvalid)
	}
	switch c.Listen.Network {
	case "tcp", "unix":
	default:
		return fmt.Errorf("broker: machine %q: listen network %q: want tcp or unix: %w", c.Name, c.Listen.Network, contract.ErrInvalid)
	}
	if c.Listen.Address == "" {
		return fmt.Errorf("broker: machine %q: no listen address: %w", c.Name, contract.ErrInvalid)
	}
	if c.FromPID && c.Listen.Network != "tcp" {
		return fmt.Errorf("broker: machine %q: from_pid is for a tcp listener: %w", c.Name, contract.ErrInvalid)
	}
	if len(c.AllowFrom) > 0 && c.Listen.Network != "tcp" {
		return fmt.Errorf("broker: machine %q: allow_from is for a tcp listener: %w", c.Name, contract.ErrInvalid)
	}
	seen := map[string]bool{}
	for i := range c.Secrets {
		b := &c.Secrets[i]
		if seen[b.Name] {
			return fmt.Errorf("broker: machine %q: secret %s twice: %w", c.Name, b.Name, contract.ErrInvalid)
		}
		seen[b.Name] = true
		k := contract.Contract{Secrets: map[string]contract.Secret{b.Name: b.Secret}}
		if err := k.Validate(); err != nil {
			return fmt.Errorf("broker: machine %q: %w", c.Name, err)
		}
		b.Secret = k.Secrets[b.Name]
		if !placeholderRE.MatchString(b.Placeholder) || !strings.HasPrefix(b.Placeholder, placeholderPrefix+b.Name+"-") {
			return fmt.Errorf("broker: machine %q: secret %s: %q is not a placeholder of it (NewPlaceholder): %w",
				c.Name, b.Name, b.Placeholder, contract.ErrInvalid)
		}
		if b.Value != nil {
			if err := checkValue(b.Value); err != nil {
				return fmt.Errorf("broker: machine %q: secret %s: %w", c.Name, b.Name, err)
			}
		}
	}
	return nil
}

// clone is a deep copy of c; without values when keep is false (what
// the registry file and List hold).
func (c Child) clone(keep bool) Child {
	c.AllowFrom = slices.Clone(c.AllowFrom)
	if c.Egress != nil {
		e := *c.Egress
		e.Allow = slices.Clone(e.Allow)
		c.Egress = &e
	}
	c.Secrets = slices.Clone(c.Secrets)
	for i := range c.Secrets {
		b := &c.Secrets[i]
		b.Secret.Hosts = slices.Clone(b.Secret.Hosts)
		if keep {
			b.Value = slices.Clone(b.Value)
		} else {
			b.Value = nil
		}
	}
	return c
}

// source names where a binding's value comes from.
func (b Binding) source() string {
	switch v := b.Secret.ValueFrom; {
	case v.Exec != "":
		return "exec"
	case v.Env != "":
		return "env"
	}
	return "file"
}
