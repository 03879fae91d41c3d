package contract

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Dest is one destination an egress allow list lets through: a host name
// (resolved on the host, never by the guest's DNS) or an address prefix,
// and a port (0: any), for TCP and UDP alike.
type Dest struct {
	// Host is a host name; empty when Prefix is set.
	Host string
	// Prefix is an address (a /32 or /128) or a prefix, when Host is empty.
	Prefix netip.Prefix
	// Port is the port, or 0 for any.
	Port int
}

// hostLabel is one label of a host name (RFC 1123).
var hostLabel = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

func validHost(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return false // an address, not a name
	}
	for _, l := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if !hostLabel.MatchString(l) {
			return false
		}
	}
	return true
}

// ParseDest parses an allow-list entry: HOST:PORT, ADDR, ADDR:PORT, CIDR or
// CIDR:PORT, where PORT is a number or * and an IPv6 address or prefix
// with a port is written in brackets ([2001:db8::/32]:443). A host name
// needs a port (HOST:* for any).
func ParseDest(s string) (Dest, error) {
	in := strings.TrimSpace(s)
	addr, port, hasPort := in, "", false
	switch {
	case strings.HasPrefix(in, "["):
		end := strings.Index(in, "]")
		if end < 0 {
			return Dest{}, fmt.Errorf("%q: no closing ]", s)
		}
		addr = in[1:end]
		rest := in[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return Dest{}, fmt.Errorf("%q: want :PORT after ]", s)
			}
			port, hasPort = rest[1:], true
		}
	case strings.Count(in, ":") == 1:
		addr, port, hasPort = strings.Cut(in, ":")
	}
	var d Dest
	if hasPort && port != "*" {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return Dest{}, fmt.Errorf("%q: port %q must be a number from 1 to 65535, or *", s, port)
		}
		d.Port = p
	}
	if pfx, err := netip.ParsePrefix(addr); err == nil {
		if pfx != pfx.Masked() {
			return Dest{}, fmt.Errorf("%q: %s has host bits set (did you mean %s?)", s, pfx, pfx.Masked())
		}
		d.Prefix = pfx
		return d, nil
	}
	if a, err := netip.ParseAddr(addr); err == nil {
		if a.Zone() != "" {
			return Dest{}, fmt.Errorf("%q: an address with a zone cannot be filtered", s)
		}
		d.Prefix = netip.PrefixFrom(a, a.BitLen())
		return d, nil
	}
	if strings.Contains(addr, "/") {
		return Dest{}, fmt.Errorf("%q: %q is not an address prefix (CIDR)", s, addr)
	}
	if !validHost(addr) {
		return Dest{}, fmt.Errorf("%q: %q is neither an address, a prefix nor a host name", s, addr)
	}
	if !hasPort {
		return Dest{}, fmt.Errorf("%q: a host name needs a port (%s:PORT, or %s:* for any)", s, addr, addr)
	}
	d.Host = strings.ToLower(strings.TrimSuffix(addr, "."))
	return d, nil
}

// String is the entry as ParseDest takes it.
func (d Dest) String() string {
	port := "*"
	if d.Port != 0 {
		port = strconv.Itoa(d.Port)
	}
	switch {
	case d.Host != "":
		return d.Host + ":" + port
	case d.Port == 0 && d.Prefix.IsSingleIP():
		return d.Prefix.Addr().String()
	case d.Port == 0:
		return d.Prefix.String()
	}
	p := d.Prefix.String()
	if d.Prefix.IsSingleIP() {
		p = d.Prefix.Addr().String()
	}
	if d.Prefix.Addr().Is6() {
		return "[" + p + "]:" + port
	}
	return p + ":" + port
}

// egressWire is Egress's mapping form.
type egressWire struct {
	Allow []string `json:"allow" yaml:"allow"`
}

func (e Egress) MarshalJSON() ([]byte, error) {
	if e.Mode != EgressAllow {
		return json.Marshal(string(e.Mode))
	}
	return json.Marshal(e.wire())
}

func (e Egress) wire() egressWire {
	w := egressWire{Allow: make([]string, len(e.Allow))}
	for i, d := range e.Allow {
		w.Allow[i] = d.String()
	}
	return w
}

func (e *Egress) UnmarshalJSON(data []byte) error {
	var mode string
	if json.Unmarshal(data, &mode) == nil {
		return e.setMode(mode)
	}
	var w egressWire
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return fmt.Errorf("network.egress: want all, none or {\"allow\": [...]}: %w", err)
	}
	return e.setAllow(w.Allow)
}

func (e Egress) MarshalYAML() (any, error) {
	if e.Mode != EgressAllow {
		return string(e.Mode), nil
	}
	return e.wire(), nil
}

func (e *Egress) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		return e.setMode(n.Value)
	}
	var w egressWire
	if n.Kind != yaml.MappingNode {
		return invalid("network.egress", "want all, none or {allow: [...]}")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i].Value; k != "allow" {
			return invalid("network.egress", "unknown key %q (want allow)", k)
		}
	}
	if err := n.Decode(&w); err != nil {
		return invalid("network.egress.allow", "want a list of destinations: %v", err)
	}
	return e.setAllow(w.Allow)
}

func (e *Egress) setMode(m string) error {
	switch EgressMode(m) {
	case EgressAll, EgressNone:
		e.Mode = EgressMode(m)
		return nil
	}
	return invalid("network.egress", "%q: want all, none or {allow: [...]}", m)
}

func (e *Egress) setAllow(entries []string) error {
	e.Mode, e.Allow = EgressAllow, nil
	for i, s := range entries {
		d, err := ParseDest(s)
		if err != nil {
			return invalid(fmt.Sprintf("network.egress.allow[%d]", i), "%v", err)
		}
		e.Allow = append(e.Allow, d)
	}
	return nil
}
