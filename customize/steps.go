package customize

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Names of vmfork's own steps.
const (
	StepAgent        = "vmfork.agent"
	StepClock        = "vmfork.clock"
	StepRNG          = "vmfork.rng"
	StepHostname     = "vmfork.hostname"
	StepMachineID    = "vmfork.machine-id"
	StepSSHHostKeys  = "vmfork.ssh-host-keys"
	StepNetwork      = "vmfork.network"
	StepHooks        = "vmfork.hooks"
	StepPreForkHooks = "vmfork.pre-fork-hooks"
)

// Default step timeouts. Generous: they bound a guest that hangs, and TCG
// guests are slow. ssh-keygen makes an RSA key, which takes seconds under
// TCG.
const (
	DefaultTimeout = 10 * time.Second
	sshTimeout     = 2 * time.Minute
	networkTimeout = 30 * time.Second
	hooksTimeout   = time.Minute
	preForkTimeout = 30 * time.Second
	scriptTimeout  = time.Minute
	maxClockOffset = time.Second
)

// AgentStep waits until the guest agent answers. The agent of a fork child
// answers at once (its connection state is in the migrated device state);
// a guest whose agent died answers never, and this step's timeout says how
// long that takes to find out.
func AgentStep() Step {
	return Step{Name: StepAgent, Timeout: DefaultTimeout, retry: true, Fn: func(ctx context.Context, env *Env) error {
		return waitAgent(ctx, env.Agent)
	}}
}

// RNGStep confirms that the guest kernel reseeded its CRNG from the child's
// new vmgenid. The GUID is the child's own (QEMU gives it to the guest on
// resume); Linux 5.18+ reseeds when it changes and logs "crng reseeded due
// to virtual machine fork". A kernel without the vmgenid driver keeps its
// siblings' random state, so the step fails there.
func RNGStep() Step {
	return Step{Name: StepRNG, Timeout: DefaultTimeout, Parts: partsRNG}
}

func partsRNG(_ context.Context, env *Env) ([]*Part, error) {
	c := env.Child
	if c.VMGenID == "" {
		return nil, fmt.Errorf("the child has no vmgenid of its own")
	}
	if strings.EqualFold(c.VMGenID, c.TemplateVMGenID) {
		return nil, fmt.Errorf("the child has its template's vmgenid %s, so its kernel would not reseed", c.VMGenID)
	}
	return []*Part{{Script: rngScript, Inline: true, Done: func(env *Env, out string) error {
		switch strings.TrimSpace(out) {
		case "reseeded":
			env.Detailf("kernel CRNG reseeded from vmgenid %s", c.VMGenID)
		case "uninitialized":
			env.Detailf("kernel CRNG not seeded yet; vmgenid %s is in the pool it will be seeded from", c.VMGenID)
		default:
			return fmt.Errorf("confirm reseed: unexpected output %q", out)
		}
		return nil
	}}}, nil
}

// keepRNGStep replaces RNGStep for a reproducible identity: it checks that
// the child kept its template's vmgenid, so the kernel did not reseed.
func keepRNGStep() Step {
	return Step{Name: StepRNG, Fn: func(_ context.Context, env *Env) error {
		c := env.Child
		if !strings.EqualFold(c.VMGenID, c.TemplateVMGenID) {
			return fmt.Errorf("a reproducible identity needs the template's vmgenid %q; the child has %q", c.TemplateVMGenID, c.VMGenID)
		}
		return Skipped("identity reproducible: the child kept its template's vmgenid, so its kernel CRNG goes on from the template's state")
	}}
}

// Reproducible rewrites c for --identity reproducible: the clock and the
// random state stay the template's. Network identity still changes.
func Reproducible(c Chain) Chain {
	c = c.Skip("identity reproducible: the clock goes on from the template's", StepClock)
	if c.Has(StepRNG) {
		c = c.Swap(keepRNGStep())
	}
	return c
}

// Booted rewrites c for a child that booted fresh from a stopped source's
// disk: its kernel seeded its own random state at boot.
func Booted(c Chain) Chain {
	return c.Skip("booted fresh: the kernel seeded its random state at boot", StepRNG)
}

// HostnameStep sets the guest's hostname from pattern (see ExpandHostname).
// With systemd-hostnamed on a bus that answers it uses hostnamectl; else
// (no D-Bus, as on minimal servers) it writes /etc/hostname and the
// kernel's name itself. Either way it renames the old name in /etc/hosts.
// Its detail names the mechanism.
func HostnameStep(pattern string) Step {
	return Step{Name: StepHostname, Timeout: DefaultTimeout, Parts: func(_ context.Context, env *Env) ([]*Part, error) {
		h, err := ExpandHostname(pattern, env.Child)
		if err != nil {
			return nil, err
		}
		env.hostname = h
		return []*Part{{Script: hostnameScript, Inline: true, Args: []string{h}, Done: func(env *Env, out string) error {
			env.Result.Hostname = h
			env.Detailf("%s (%s)", h, strings.TrimSpace(out))
			return nil
		}}}, nil
	}}
}

// Hostname placeholders.
var hostnameVars = map[string]func(Child) string{
	"n":      func(c Child) string { return strconv.Itoa(c.Index) },
	"name":   func(c Child) string { return c.Name },
	"parent": func(c Child) string { return c.Parent },
}

// ExpandHostname fills in pattern for child c: {n} is its index in the fork
// (1, 2, ...), {name} its machine name, {parent} its source's. The result
// must be a valid hostname.
func ExpandHostname(pattern string, c Child) (string, error) {
	var b strings.Builder
	rest := pattern
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			b.WriteString(rest)
			break
		}
		b.WriteString(rest[:i])
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return "", fmt.Errorf("hostname pattern %q: unclosed {", pattern)
		}
		name := rest[i+1 : i+j]
		f, ok := hostnameVars[name]
		if !ok {
			return "", fmt.Errorf("hostname pattern %q: unknown placeholder {%s} (want {n}, {name} or {parent})", pattern, name)
		}
		b.WriteString(f(c))
		rest = rest[i+j+1:]
	}
	h := b.String()
	if err := checkHostname(h); err != nil {
		return "", fmt.Errorf("hostname pattern %q: %w", pattern, err)
	}
	return h, nil
}

// checkHostname accepts RFC 1123 host names: dot-separated labels of
// letters, digits and inner hyphens, 63 bytes each, 253 in all.
func checkHostname(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("hostname %q must have 1 to 253 characters", h)
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("hostname %q: label %q must have 1 to 63 characters and not start or end with '-'", h, l)
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("hostname %q: %q is not allowed (letters, digits, '-' and '.' only)", h, r)
			}
		}
	}
	return nil
}

// MachineIDStep writes a new random /etc/machine-id (and the D-Bus copy
// where it is a file of its own, not the usual link) and restarts
// systemd-journald, which otherwise goes on writing to the journal of the
// old id. Guests without /etc/machine-id are skipped. systemd-networkd
// derives its DHCP client identifier from the machine-id when it starts, so
// this step comes before vmfork.network, which restarts it.
func MachineIDStep() Step {
	return Step{Name: StepMachineID, Timeout: DefaultTimeout, Parts: func(context.Context, *Env) ([]*Part, error) {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		id := hex.EncodeToString(b[:])
		var detail string
		return []*Part{{Script: machineIDScript, Inline: true, Args: []string{id}, Done: func(env *Env, out string) error {
			env.Result.MachineID = id
			detail = fmt.Sprintf("%s (%s)", id, strings.TrimSpace(out))
			env.Detailf("%s", detail)
			return nil
		}}, {Script: journaldScript, Inline: true, Last: true, Done: func(env *Env, out string) error {
			if out = strings.TrimSpace(out); out != "" {
				detail = strings.TrimSuffix(detail, ")") + "; " + out + ")"
			}
			env.Detailf("%s", detail)
			return nil
		}}}, nil
	}}
}
