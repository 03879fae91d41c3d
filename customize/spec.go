package customize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/vmfork/vmfork/contract"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Mode says what a child keeps of its template (see the package doc).
type Mode string

// Identity modes.
const (
	ModeFresh        Mode = "fresh"
	ModeReproducible Mode = "reproducible"
)

// ParseMode parses "fresh" or "reproducible".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeFresh, ModeReproducible:
		return m, nil
	}
	return "", fmt.Errorf("identity %q: want fresh or reproducible", s)
}

// DefaultHostname is the hostname pattern when a spec gives none: the
// child's machine name, unique on its host.
const DefaultHostname = "{name}"

// Limits on what a spec file names.
const (
	maxSpecBytes   = 1 << 20
	maxScriptBytes = 1 << 20
)

// Spec says how fork children are customized. The zero Spec is the default:
// a fresh identity, the machine name as hostname, DHCP. In YAML:
//
//	identity: fresh            # or reproducible
//	hostname: web-{n}          # {n} index in the fork, {name}, {parent}
//	network:
//	  mode: static             # dhcp (default), static or none
//	  addresses: [10.0.2.21/24, 10.0.2.22/24]   # child n gets the n-th
//	  gateway: 10.0.2.2
//	  dns: [10.0.2.3]
//	skip: [vmfork.ssh-host-keys]
//	timeouts:
//	  vmfork.agent: 5s
//	  vmfork.pre-fork-hooks: 10s
//	steps:                     # host scripts copied into each child and run
//	  - name: acme.register
//	    script: register.sh    # relative to the spec file
//	    args: [--fast]
//	    after: vmfork.network  # default: at the end
//	    timeout: 20s
//	on_failure: kill           # or keep (the child stays, its link down)
//	contract:                  # the children's fork contract (package contract)
//	  network: {egress: none}
//
// JSON has the same keys.
type Spec struct {
	Identity  Mode                `json:"identity,omitempty" yaml:"identity,omitempty"`
	Hostname  string              `json:"hostname,omitempty" yaml:"hostname,omitempty"`
	Network   NetworkSpec         `json:"network,omitempty" yaml:"network,omitempty"`
	Skip      []string            `json:"skip,omitempty" yaml:"skip,omitempty"`
	Timeouts  map[string]Duration `json:"timeouts,omitempty" yaml:"timeouts,omitempty"`
	Steps     []ScriptSpec        `json:"steps,omitempty" yaml:"steps,omitempty"`
	OnFailure string              `json:"on_failure,omitempty" yaml:"on_failure,omitempty"`
	// Contract is the children's fork contract; --contract FILE overrides
	// it. The identity chain does not read it: the Manager does.
	Contract *contract.Contract `json:"contract,omitempty" yaml:"contract,omitempty"`
	// Disks are the fork's disk policies by disk id (cow, shared, fresh,
	// keep), as fork --disk-policy gives them, which override these. The
	// identity chain does not read them: the Manager does.
	Disks map[string]string `json:"disks,omitempty" yaml:"disks,omitempty"`

	// Dir is where relative script paths start; LoadSpec sets it to the
	// spec file's directory, else it is the working directory.
	Dir string `json:"-" yaml:"-"`
}

// ScriptSpec is an extra step: a host script copied into the guest and run.
type ScriptSpec struct {
	Name    string   `json:"name" yaml:"name"`
	Script  string   `json:"script" yaml:"script"`
	Args    []string `json:"args,omitempty" yaml:"args,omitempty"`
	After   string   `json:"after,omitempty" yaml:"after,omitempty"`
	Timeout Duration `json:"timeout,omitempty" yaml:"timeout,omitempty"`
}

// Duration is a time.Duration written as "30s" or "2m".
type Duration time.Duration

func parseDuration(s string) (Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("duration %q: want a positive duration such as 30s", s)
	}
	return Duration(d), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration %s: want a string such as \"30s\"", b)
	}
	v, err := parseDuration(s)
	*d = v
	return err
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a duration such as 30s", n.Line)
	}
	v, err := parseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*d = v
	return nil
}

// LoadSpec reads a spec file: JSON if its name ends in .json, else YAML.
// Unknown keys, a second document and bad values are errors.
func LoadSpec(file string) (Spec, error) {
	var s Spec
	f, err := os.Open(file)
	if err != nil {
		return s, fmt.Errorf("spec: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSpecBytes+1))
	if err != nil {
		return s, fmt.Errorf("spec %s: %w", file, err)
	}
	if len(data) > maxSpecBytes {
		return s, fmt.Errorf("spec %s: larger than %d bytes", file, maxSpecBytes)
	}
	if strings.EqualFold(filepath.Ext(file), ".json") {
		err = decodeJSON(data, &s)
	} else {
		err = decodeYAML(data, &s)
	}
	if err != nil {
		return Spec{}, fmt.Errorf("spec %s: %w", file, err)
	}
	s.Dir = filepath.Dir(file)
	if err := s.Validate(); err != nil {
		return Spec{}, fmt.Errorf("spec %s: %w", file, err)
	}
	return s, nil
}

func decodeJSON(data []byte, s *Spec) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(s); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

// goTypeName is yaml.v3's way of naming where a key is unknown; users know
// the file, not the Go types.
var goTypeName = regexp.MustCompile(` in type [\w.\[\]*]+`)

func decodeYAML(data []byte, s *Spec) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(s)
	if errors.Is(err, io.EOF) {
		return nil // an empty file: the defaults
	}
	if err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return errors.New(goTypeName.ReplaceAllString(strings.Join(te.Errors, "; "), ""))
		}
		return err
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("more than one YAML document")
	}
	return nil
}

// Mode returns the identity mode, filling in the default.
func (s Spec) Mode() Mode {
	if s.Identity == "" {
		return ModeFresh
	}
	return s.Identity
}

// KeepOnFailure reports whether on_failure says keep.
func (s Spec) KeepOnFailure() bool { return s.OnFailure == "keep" }

// Validate checks the spec and every file it names, without touching a
// guest. Chain and PreForkChain fail only where Validate does.
func (s Spec) Validate() error {
	if err := s.Contract.Validate(); err != nil {
		return err
	}
	_, err := s.Chain()
	return err
}

// ValidateFor checks that the spec can serve a fork of n children: with
// static addresses, there must be one for each.
func (s Spec) ValidateFor(n int) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if s.Network.EffectiveMode() == NetworkStatic && n > len(s.Network.Addresses) {
		return fmt.Errorf("network: %d static addresses for %d children", len(s.Network.Addresses), n)
	}
	return nil
}

var stepName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)+$`)

// DefaultChain returns vmfork's steps for a fresh identity, with hostname
// pattern and network configuration n.
func DefaultChain(hostname string, n NetworkSpec) Chain {
	if hostname == "" {
		hostname = DefaultHostname
	}
	return NewChain(
		AgentStep(),
		ClockStep(),
		RNGStep(),
		HostnameStep(hostname),
		MachineIDStep(),
		SSHHostKeysStep(),
		NetworkStep(n),
		HooksStep(PostForkDir),
	)
}

// Chain returns the chain the spec asks for: the default steps configured
// by it, its mode's variant, its extra steps, timeouts and skips.
func (s Spec) Chain() (Chain, error) {
	if _, err := ParseMode(string(s.Mode())); err != nil {
		return Chain{}, err
	}
	switch s.OnFailure {
	case "", "kill", "keep":
	default:
		return Chain{}, fmt.Errorf("on_failure %q: want kill or keep", s.OnFailure)
	}
	if s.Hostname != "" {
		if _, err := ExpandHostname(s.Hostname, Child{Index: 1, Name: "child", Parent: "parent"}); err != nil {
			return Chain{}, err
		}
	}
	if err := s.Network.validate(); err != nil {
		return Chain{}, err
	}
	c := DefaultChain(s.Hostname, s.Network)
	if s.Mode() == ModeReproducible {
		c = Reproducible(c)
	}
	for _, x := range s.Steps {
		st, err := s.scriptStep(x)
		if err != nil {
			return Chain{}, err
		}
		if c.Has(x.Name) {
			return Chain{}, fmt.Errorf("step %q is defined twice", x.Name)
		}
		switch {
		case x.After == "":
			c = c.Append(st)
		case c.Has(x.After):
			c = c.AppendAfter(x.After, st)
		default:
			return Chain{}, fmt.Errorf("step %q: after %q: no such step", x.Name, x.After)
		}
	}
	names := make([]string, 0, len(s.Timeouts))
	for name := range s.Timeouts {
		names = append(names, name)
	}
	slices.Sort(names) // the first unknown name is the one reported
	for _, name := range names {
		if name == StepPreForkHooks {
			continue
		}
		if !c.Has(name) {
			return Chain{}, fmt.Errorf("timeouts: no step %q (steps: %s)", name, knownSteps(c))
		}
		c = c.WithTimeout(name, time.Duration(s.Timeouts[name]))
	}
	for _, name := range s.Skip {
		if name != StepPreForkHooks && !c.Has(name) {
			return Chain{}, fmt.Errorf("skip: no step %q (steps: %s)", name, knownSteps(c))
		}
	}
	c = c.Skip("skipped by request", s.Skip...)
	return c, c.Validate()
}

func knownSteps(c Chain) string {
	return strings.Join(append(c.Names(), StepPreForkHooks), ", ")
}

func (s Spec) scriptStep(x ScriptSpec) (Step, error) {
	if !stepName.MatchString(x.Name) || strings.HasPrefix(x.Name, "vmfork.") {
		return Step{}, fmt.Errorf("step name %q: want a namespaced name of your own such as acme.register (lowercase; vmfork. is reserved)", x.Name)
	}
	if x.Script == "" {
		return Step{}, fmt.Errorf("step %q: no script", x.Name)
	}
	file := x.Script
	if !filepath.IsAbs(file) {
		file = filepath.Join(s.Dir, file)
	}
	st, err := os.Stat(file)
	if err != nil {
		return Step{}, fmt.Errorf("step %q: %w", x.Name, err)
	}
	if !st.Mode().IsRegular() || st.Size() > maxScriptBytes {
		return Step{}, fmt.Errorf("step %q: script %s must be a regular file of at most %d bytes", x.Name, file, maxScriptBytes)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return Step{}, fmt.Errorf("step %q: %w", x.Name, err)
	}
	step := ScriptStep(x.Name, data, x.Args)
	if x.Timeout > 0 {
		step.Timeout = time.Duration(x.Timeout)
	}
	return step, nil
}

// PreForkChain returns the chain run in a running source before it is
// frozen: its pre-fork hooks, unless the spec skips them.
func (s Spec) PreForkChain() Chain {
	c := NewChain(PreForkHooksStep(PreForkDir))
	if d, ok := s.Timeouts[StepPreForkHooks]; ok {
		c = c.WithTimeout(StepPreForkHooks, time.Duration(d))
	}
	if slices.Contains(s.Skip, StepPreForkHooks) {
		c = c.Skip("skipped by request", StepPreForkHooks)
	}
	return c
}
