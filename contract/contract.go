package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Contract is what a machine may be: what it may reach, which secrets the
// host adds to its requests, and which secret files a child must not keep
// of its parent's. The zero Contract (and a nil one) says nothing and
// enforces nothing: the machine is a perfect copy of its parent, as
// without a contract.
type Contract struct {
	// Network says what the machine may reach; nil reaches everything
	// and keeps its connections, as a machine without a contract does.
	Network *Network `json:"network,omitempty" yaml:"network,omitempty"`
	// Secrets are values the guest never holds, by name: the guest holds
	// a placeholder, and the host's broker puts the value in its requests
	// to the secret's hosts.
	Secrets map[string]Secret `json:"secrets,omitempty" yaml:"secrets,omitempty"`
	// SecretFiles are the guest's own files that hold secrets: a fork
	// child gets them wiped or rotated (its own value) before its NIC
	// comes up. Nil, or one that lists nothing, leaves them as the parent
	// has them.
	SecretFiles *SecretFiles `json:"secret_files,omitempty" yaml:"secret_files,omitempty"`
}

// Network is a contract's network part: the only part a running machine's
// contract can change in place (vmfork contract NAME --set).
type Network struct {
	Egress Egress `json:"egress" yaml:"egress"`
	// DNS is what the machine may resolve through: host (the host's
	// resolver, as the network gives it) or none.
	DNS DNSMode `json:"dns,omitempty" yaml:"dns,omitempty"`
	// Connections is what becomes of the TCP connections a child inherits
	// from its parent's instant: reset (closed in the child before its NIC
	// comes up) or keep.
	Connections ConnMode `json:"connections,omitempty" yaml:"connections,omitempty"`
}

// DNSMode is Network.DNS.
type DNSMode string

// ConnMode is Network.Connections.
type ConnMode string

// EgressMode is Egress.Mode.
type EgressMode string

const (
	DNSHost DNSMode = "host"
	DNSNone DNSMode = "none"

	ConnReset ConnMode = "reset"
	ConnKeep  ConnMode = "keep"

	EgressAll   EgressMode = "all"
	EgressNone  EgressMode = "none"
	EgressAllow EgressMode = "allow"
)

// Egress is where a machine may open connections and send datagrams (TCP
// and UDP alike): everywhere, nowhere, or only to the destinations listed.
// In YAML and JSON it is "all", "none" or {"allow": [DEST...]}.
type Egress struct {
	Mode  EgressMode
	Allow []Dest
}

// Secret is a value the guest never holds.
type Secret struct {
	// Hosts are the only hosts whose requests get the value (exact names,
	// as the request's Host says).
	Hosts []string `json:"hosts" yaml:"hosts"`
	// Header is the request header that carries it (default
	// Authorization).
	Header string `json:"header,omitempty" yaml:"header,omitempty"`
	// Format is the header's value, {value} standing for the secret
	// (default "{value}").
	Format string `json:"format,omitempty" yaml:"format,omitempty"`
	// ValueFrom says where the host gets the value.
	ValueFrom ValueFrom `json:"value_from" yaml:"value_from"`
}

// ValueFrom names exactly one source of a secret's value.
type ValueFrom struct {
	// Exec is a command run on the host (through /bin/sh -c) with the
	// child's name, parent and index in VMFORK_NAME, VMFORK_PARENT and
	// VMFORK_INDEX; its standard output, less one trailing newline, is
	// that child's value.
	Exec string `json:"exec,omitempty" yaml:"exec,omitempty"`
	// Env is an environment variable of the vmfork command that makes
	// the machine.
	Env string `json:"env,omitempty" yaml:"env,omitempty"`
	// File is a host file whose contents, less one trailing newline, are
	// the value.
	File string `json:"file,omitempty" yaml:"file,omitempty"`
}

// Error is a contract that is not valid: Field names what is wrong, as a
// path through the spec (network.egress.allow[2]).
type Error struct {
	Field string
	Err   error
}

func (e *Error) Error() string { return "contract: " + e.Field + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// ErrInvalid is wrapped by every Error.
var ErrInvalid = errors.New("invalid contract")

func invalid(field, format string, args ...any) error {
	return &Error{Field: field, Err: fmt.Errorf(format+": %w", append(args, ErrInvalid)...)}
}

// maxFileBytes bounds a contract file.
const maxFileBytes = 1 << 20

// Load reads a contract from file: JSON if its name ends in .json, YAML
// otherwise. Unknown keys are errors. It validates the contract.
func Load(file string) (*Contract, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("contract: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("contract %s: %w", file, err)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("contract %s: larger than %d bytes: %w", file, maxFileBytes, ErrInvalid)
	}
	var c *Contract
	if strings.EqualFold(filepath.Ext(file), ".json") {
		c, err = ParseJSON(data)
	} else {
		c, err = ParseYAML(data)
	}
	if err != nil {
		return nil, fmt.Errorf("contract %s: %w", file, err)
	}
	return c, nil
}

// ParseJSON decodes and validates a contract.
func ParseJSON(data []byte) (*Contract, error) {
	var c Contract
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, ErrInvalid) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	if dec.More() {
		return nil, fmt.Errorf("unexpected data after the JSON object: %w", ErrInvalid)
	}
	return &c, c.Validate()
}

// ParseYAML decodes and validates a contract.
func ParseYAML(data []byte) (*Contract, error) {
	var c Contract
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlError(err)
	}
	return &c, c.Validate()
}

// unknownField is how yaml.v3 words an unknown key.
var unknownField = regexp.MustCompile(`^line (\d+): field (\S+) not found in type \S+$`)

// yamlError is err on one line: yaml.v3 lists a document's errors one per
// line, and calls an unknown key a field not found in a Go type.
func yamlError(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		var ce *Error
		if errors.As(err, &ce) {
			return err
		}
		return fmt.Errorf("%s: %w", strings.ReplaceAll(err.Error(), "\n", "; "), ErrInvalid)
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		if g := unknownField.FindStringSubmatch(m); g != nil {
			m = fmt.Sprintf("unknown key %q (line %s)", g[2], g[1])
		}
		msgs[i] = m
	}
	return fmt.Errorf("%s: %w", strings.Join(msgs, "; "), ErrInvalid)
}

var (
	secretName = regexp.MustCompile(`^[A-Z_][A-Z0-9_]{0,63}$`)
	headerName = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_` + "`" + `|~-]{1,64}$`)
)

// Validate checks every field and fills in the defaults (DNS host,
// connections reset, header Authorization, format {value}; a secret_files
// that lists nothing is dropped). The first
// problem found is returned as an *Error naming the field.
func (c *Contract) Validate() error {
	if c == nil {
		return nil
	}
	if n := c.Network; n != nil {
		if err := n.validate(); err != nil {
			return err
		}
	}
	if c.SecretFiles != nil {
		if err := c.SecretFiles.validate(); err != nil {
			return err
		}
		if c.SecretFiles.empty() {
			c.SecretFiles = nil // asks for nothing, as if absent
		}
	}
	names := make([]string, 0, len(c.Secrets))
	for name := range c.Secrets {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		s := c.Secrets[name]
		if err := s.validate("secrets."+name, name); err != nil {
			return err
		}
		c.Secrets[name] = s
	}
	return nil
}

func (n *Network) validate() error {
	switch n.Egress.Mode {
	case EgressAll, EgressNone:
	case EgressAllow:
		if len(n.Egress.Allow) == 0 {
			return invalid("network.egress.allow", "lists no destination (egress: none allows none)")
		}
	case "":
		n.Egress.Mode = EgressAll
	default:
		return invalid("network.egress", "%q: want all, none or {allow: [...]}", n.Egress.Mode)
	}
	switch n.DNS {
	case "":
		n.DNS = DNSHost
	case DNSHost, DNSNone:
	default:
		return invalid("network.dns", "%q: want host or none", n.DNS)
	}
	switch n.Connections {
	case "":
		n.Connections = ConnReset
	case ConnReset, ConnKeep:
	default:
		return invalid("network.connections", "%q: want reset or keep", n.Connections)
	}
	return nil
}

func (s *Secret) validate(field, name string) error {
	if !secretName.MatchString(name) {
		return invalid(field, "name must be an environment variable's: capital letters, digits and '_', not starting with a digit")
	}
	if len(s.Hosts) == 0 {
		return invalid(field+".hosts", "is empty: a secret goes only to the hosts it is bound to")
	}
	for i, h := range s.Hosts {
		if !validHost(h) {
			return invalid(fmt.Sprintf("%s.hosts[%d]", field, i), "%q is not a host name", h)
		}
		s.Hosts[i] = strings.ToLower(h)
	}
	if s.Header == "" {
		s.Header = "Authorization"
	}
	if !headerName.MatchString(s.Header) {
		return invalid(field+".header", "%q is not an HTTP header name", s.Header)
	}
	if s.Format == "" {
		s.Format = "{value}"
	}
	if !strings.Contains(s.Format, "{value}") || strings.ContainsAny(s.Format, "\r\n") {
		return invalid(field+".format", "%q must hold {value} and no line break", s.Format)
	}
	v := s.ValueFrom
	set := 0
	for _, x := range []string{v.Exec, v.Env, v.File} {
		if x != "" {
			set++
		}
	}
	if set != 1 {
		return invalid(field+".value_from", "want exactly one of exec, env and file")
	}
	if v.File != "" && !filepath.IsAbs(v.File) {
		return invalid(field+".value_from.file", "%q must be an absolute path", v.File)
	}
	return nil
}

// SecretNames returns the contract's secret names, sorted.
func (c *Contract) SecretNames() []string {
	if c == nil {
		return nil
	}
	names := make([]string, 0, len(c.Secrets))
	for n := range c.Secrets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Enforced reports whether c asks for anything: a machine whose contract
// asks for nothing is a perfect copy, as one without a contract is.
func (c *Contract) Enforced() bool {
	return c != nil && (c.Network != nil || len(c.Secrets) > 0 || !c.SecretFiles.empty())
}

// OnHost reports whether enforcing c needs the host to act for the
// machine from the moment its QEMU starts: egress rules other than all,
// DNS refused, or the broker for its secrets. A contract that is only
// guest steps (connections reset, secret files) does not.
func (c *Contract) OnHost() bool {
	n := c.NetworkOf()
	return c != nil && (n.Egress.Mode != EgressAll || n.DNS == DNSNone || len(c.Secrets) > 0)
}

// Clone returns a deep copy of c (nil for nil).
func (c *Contract) Clone() *Contract {
	if c == nil {
		return nil
	}
	out := &Contract{}
	if c.Network != nil {
		n := *c.Network
		n.Egress.Allow = slices.Clone(n.Egress.Allow)
		out.Network = &n
	}
	if c.Secrets != nil {
		out.Secrets = make(map[string]Secret, len(c.Secrets))
		for k, s := range c.Secrets {
			s.Hosts = slices.Clone(s.Hosts)
			out.Secrets[k] = s
		}
	}
	if f := c.SecretFiles; f != nil {
		out.SecretFiles = &SecretFiles{Wipe: slices.Clone(f.Wipe)}
		if f.Rotate != nil {
			out.SecretFiles.Rotate = maps.Clone(f.Rotate)
		}
	}
	return out
}

// NetworkOf returns c's network part, or the one a machine without a
// contract has: egress all, DNS host, connections kept.
func (c *Contract) NetworkOf() Network {
	if c == nil || c.Network == nil {
		return Network{Egress: Egress{Mode: EgressAll}, DNS: DNSHost, Connections: ConnKeep}
	}
	return *c.Network
}
