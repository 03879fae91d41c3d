package mcpserver

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/contract"
)

// Limits are what the operator allows the agent; the agent cannot change
// them. The names in LimitError (and in the server's flags) are the field
// names below in kebab case.
type Limits struct {
	// Agent names whose machines these are: ownership is kept per agent
	// (owner.go), so two servers with different agents do not see each
	// other's machines.
	Agent string
	// Sources are the machines and kept templates the agent may fork and
	// read, never change. Machines the agent made it may fork too.
	Sources []string
	// MaxMachines bounds the machines the agent holds at once; MaxChildren
	// the machines one call makes (fork's children, explore's branches).
	MaxMachines int
	MaxChildren int
	// TTLDefault is the TTL of a machine whose call names none; TTLMax the
	// longest one a call may name. Every machine the agent makes has one.
	TTLDefault time.Duration
	TTLMax     time.Duration
	// Contract is what every child gets; an agent's own may only narrow it
	// (Narrows). Nil: the source's, which the agent may narrow likewise.
	Contract *contract.Contract
	// ExecAllow, if set, are the only commands exec may run (by the base
	// name of the command, as "sh" or "/usr/bin/python3"); explore runs
	// shell, so it needs "sh" here.
	ExecAllow []string
	// OutputBytes bounds the stdout and stderr tails a tool returns.
	OutputBytes int
	// FileBytes bounds read_file and write_file.
	FileBytes int
}

// Defaults for the Limits an operator leaves unset.
const (
	DefaultMaxMachines = 8
	DefaultMaxChildren = 4
	DefaultTTL         = 30 * time.Minute
	DefaultTTLMax      = 2 * time.Hour
	DefaultOutputBytes = 4096
	DefaultFileBytes   = 1 << 20
)

// WithDefaults fills what the operator left unset.
func (l Limits) WithDefaults() Limits {
	if l.Agent == "" {
		l.Agent = "agent"
	}
	if l.MaxMachines == 0 {
		l.MaxMachines = DefaultMaxMachines
	}
	if l.MaxChildren == 0 {
		l.MaxChildren = DefaultMaxChildren
	}
	if l.TTLMax == 0 {
		l.TTLMax = DefaultTTLMax
	}
	if l.TTLDefault == 0 {
		l.TTLDefault = min(DefaultTTL, l.TTLMax)
	}
	if l.OutputBytes == 0 {
		l.OutputBytes = DefaultOutputBytes
	}
	if l.FileBytes == 0 {
		l.FileBytes = DefaultFileBytes
	}
	return l
}

// Validate checks the operator's limits (a bad flag: the server does not
// start).
func (l Limits) Validate() error {
	if err := vmfork.ValidateName(l.Agent); err != nil {
		return fmt.Errorf("--agent: %w", err)
	}
	if len(l.Sources) == 0 {
		return fmt.Errorf("--source: name at least one machine or kept template the agent may fork: %w", vmfork.ErrInvalid)
	}
	for _, s := range l.Sources {
		if err := vmfork.ValidateName(s); err != nil {
			return fmt.Errorf("--source: %w", err)
		}
	}
	switch {
	case l.MaxMachines < 1:
		return fmt.Errorf("--max-machines %d: want at least 1: %w", l.MaxMachines, vmfork.ErrInvalid)
	case l.MaxChildren < 1 || l.MaxChildren > vmfork.DefaultMaxChildren:
		return fmt.Errorf("--max-children %d: want 1 to %d: %w", l.MaxChildren, vmfork.DefaultMaxChildren, vmfork.ErrInvalid)
	case l.TTLMax <= 0 || l.TTLMax > vmfork.MaxTTL:
		return fmt.Errorf("--ttl-max %s: want more than 0 and at most %s: %w", l.TTLMax, vmfork.MaxTTL, vmfork.ErrInvalid)
	case l.TTLDefault <= 0 || l.TTLDefault > l.TTLMax:
		return fmt.Errorf("--ttl %s: want more than 0 and at most --ttl-max (%s): %w", l.TTLDefault, l.TTLMax, vmfork.ErrInvalid)
	case l.OutputBytes < 1 || l.FileBytes < 1:
		return fmt.Errorf("--output-bytes and --file-bytes must be positive: %w", vmfork.ErrInvalid)
	}
	return nil
}

// LimitError is a request beyond one of the operator's limits. Its message
// names the limit, so an agent can tell a refusal from a failure.
type LimitError struct {
	Limit string // max-machines, max-children, source, ttl-max, contract, exec-allow, owner, file-bytes
	Msg   string
}

func (e *LimitError) Error() string { return "limit " + e.Limit + ": " + e.Msg }

// Unwrap makes a LimitError bad input: nothing was changed.
func (e *LimitError) Unwrap() error { return vmfork.ErrInvalid }

func limitErr(limit, format string, args ...any) error {
	return &LimitError{Limit: limit, Msg: fmt.Sprintf(format, args...)}
}

// IsLimit reports whether err is a refusal by a limit.
func IsLimit(err error) bool {
	var le *LimitError
	return errors.As(err, &le)
}

// ttl resolves a call's TTL in seconds (0: the default).
func (l Limits) ttl(seconds float64) (time.Duration, error) {
	if seconds < 0 {
		return 0, fmt.Errorf("ttl_s %v: want a positive number of seconds (0 or none for the default, %s): %w", seconds, l.TTLDefault, vmfork.ErrInvalid)
	}
	if seconds == 0 {
		return l.TTLDefault, nil
	}
	d := time.Duration(seconds * float64(time.Second))
	if d > l.TTLMax {
		return 0, limitErr("ttl-max", "ttl_s %v is above the operator's maximum of %s", seconds, l.TTLMax)
	}
	if d < time.Second {
		return 0, fmt.Errorf("ttl_s %v: want at least 1 second: %w", seconds, vmfork.ErrInvalid)
	}
	return d, nil
}

// checkExec checks argv[0] against ExecAllow.
func (l Limits) checkExec(argv []string) error {
	if len(l.ExecAllow) == 0 || len(argv) == 0 {
		return nil
	}
	for _, a := range l.ExecAllow {
		if argv[0] == a || path.Base(argv[0]) == a {
			return nil
		}
	}
	return limitErr("exec-allow", "command %q is not one the operator allows (%s)", argv[0], strings.Join(l.ExecAllow, ", "))
}

// isSource reports whether name is one of the operator's sources.
func (l Limits) isSource(name string) bool { return slices.Contains(l.Sources, name) }

// Narrows checks that the agent's contract ag gives a child no more than
// base does, and returns an error naming the first field that widens it.
// Network: egress none ⊂ allow (a subset of the base's list) ⊂ all; DNS
// none ⊂ host; connections reset ⊂ keep. Secrets and rotated files run
// host commands (their value_from), so the agent may only drop some of
// the base's, never add or change one; wiped files it may add, never drop.
func Narrows(base, ag *contract.Contract) error {
	bn, an := base.NetworkOf(), ag.NetworkOf()
	if err := narrowsEgress(bn.Egress, an.Egress); err != nil {
		return err
	}
	if bn.DNS == contract.DNSNone && an.DNS != contract.DNSNone {
		return limitErr("contract", "network.dns %q widens the operator's %q", orDefault(string(an.DNS), "host"), bn.DNS)
	}
	if bn.Connections == contract.ConnReset && an.Connections != contract.ConnReset {
		return limitErr("contract", "network.connections %q widens the operator's %q", orDefault(string(an.Connections), "keep"), bn.Connections)
	}
	var bs, as map[string]contract.Secret
	if base != nil {
		bs = base.Secrets
	}
	if ag != nil {
		as = ag.Secrets
	}
	for _, k := range slices.Sorted(maps.Keys(as)) {
		b, ok := bs[k]
		if !ok || !reflect.DeepEqual(b, as[k]) {
			return limitErr("contract", "secrets.%s is not the operator's: an agent may drop secrets, not add or change them", k)
		}
	}
	var bf, af contract.SecretFiles
	if base != nil && base.SecretFiles != nil {
		bf = *base.SecretFiles
	}
	if ag != nil && ag.SecretFiles != nil {
		af = *ag.SecretFiles
	}
	for _, w := range bf.Wipe {
		if !slices.Contains(af.Wipe, w) {
			return limitErr("contract", "secret_files.wipe drops %q, which the operator's contract wipes", w)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(bf.Rotate)) {
		if r, ok := af.Rotate[p]; !ok || r != bf.Rotate[p] {
			return limitErr("contract", "secret_files.rotate drops or changes %q, which the operator's contract rotates", p)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(af.Rotate)) {
		if _, ok := bf.Rotate[p]; !ok {
			return limitErr("contract", "secret_files.rotate adds %q: rotation runs a host command, only the operator adds one", p)
		}
	}
	return nil
}

func narrowsEgress(b, a contract.Egress) error {
	switch {
	case b.Mode == contract.EgressAll || a.Mode == contract.EgressNone:
		return nil
	case b.Mode == contract.EgressNone:
		return limitErr("contract", "network.egress %q widens the operator's \"none\"", a.Mode)
	case a.Mode == contract.EgressAll:
		return limitErr("contract", "network.egress \"all\" widens the operator's allow list")
	}
	for _, d := range a.Allow {
		if !slices.Contains(b.Allow, d) {
			return limitErr("contract", "network.egress.allow %s is not in the operator's allow list", d)
		}
	}
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
