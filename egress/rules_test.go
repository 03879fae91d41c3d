package egress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vmfork/vmfork/contract"
)

// fakeResolver answers from a map; a missing name is "no such host".
type fakeResolver map[string][]string

func (f fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	if network != "ip" {
		return nil, fmt.Errorf("network %q, want ip", network)
	}
	addrs, ok := f[host]
	if !ok {
		return nil, fmt.Errorf("lookup %s: no such host", host)
	}
	var out []netip.Addr
	for _, a := range addrs {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

func network(t *testing.T, yaml string) contract.Network {
	t.Helper()
	c, err := contract.ParseYAML([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return *c.Network
}

func TestCompileModes(t *testing.T) {
	for _, tc := range []struct {
		spec      string
		mode      contract.EgressMode
		dns       contract.DNSMode
		restrictd bool
	}{
		{"network: {egress: all}", contract.EgressAll, contract.DNSHost, false},
		{"network: {egress: none}", contract.EgressNone, contract.DNSHost, false},
		{"network: {egress: none, dns: none}", contract.EgressNone, contract.DNSNone, true},
		{"network: {egress: all, dns: none}", contract.EgressAll, contract.DNSNone, false},
	} {
		r, err := Compile(t.Context(), network(t, tc.spec), fakeResolver{})
		if err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		if r.Mode != tc.mode || r.DNS != tc.dns || len(r.Allow) != 0 {
			t.Errorf("%s: got %+v, want mode %s, dns %s, no tuples", tc.spec, r, tc.mode, tc.dns)
		}
		if got := len(UserNetdevOptions(r)) > 0; got != tc.restrictd {
			t.Errorf("%s: restrict=on %v, want %v", tc.spec, got, tc.restrictd)
		}
	}
	// The zero Network is a machine without a contract's: all, host.
	r, err := Compile(t.Context(), contract.Network{}, fakeResolver{})
	if err != nil || r.Mode != contract.EgressAll || r.DNS != contract.DNSHost {
		t.Errorf("zero Network: got %+v, %v, want all and host", r, err)
	}
}

func TestCompileAllow(t *testing.T) {
	n := network(t, `network:
  egress:
    allow:
      - 10.0.0.0/8:443
      - db.internal:5432
      - "[2001:db8::/32]:*"
      - 169.254.169.254:80
      - 0.0.0.0/0:53
      - db.internal:5432
`)
	res := fakeResolver{"db.internal": {"10.1.2.3", "::ffff:10.1.2.4", "fd00::5"}}
	r, err := Compile(t.Context(), n, res)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tu := range r.Allow {
		got = append(got, tu.String()+" <- "+tu.From)
	}
	want := []string{
		// Link-local first: they come before the link-local drop.
		"tcp+udp 169.254.169.254 port 80 <- 169.254.169.254:80",
		"tcp+udp 10.0.0.0/8 port 443 <- 10.0.0.0/8:443",
		"tcp+udp 10.1.2.3 port 5432 <- db.internal:5432",
		"tcp+udp 10.1.2.4 port 5432 <- db.internal:5432", // unmapped
		"tcp+udp fd00::5 port 5432 <- db.internal:5432",
		"tcp+udp 2001:db8::/32 any port <- 2001:db8::/32",
		"tcp+udp 0.0.0.0/0 port 53 <- 0.0.0.0/0:53",
		// The repeated entry adds nothing.
	}
	if !slices.Equal(got, want) {
		t.Errorf("tuples:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestCompileUnresolved(t *testing.T) {
	n := network(t, "network: {egress: {allow: [10.0.0.1:80, nowhere.test:443]}}")
	_, err := Compile(t.Context(), n, fakeResolver{})
	if err == nil {
		t.Fatal("Compile with an unresolvable name succeeded")
	}
	var ce *contract.Error
	if !errors.As(err, &ce) || ce.Field != "network.egress.allow[1]" {
		t.Errorf("error %v does not name network.egress.allow[1]", err)
	}
	if !errors.Is(err, ErrUnresolved) || !strings.Contains(err.Error(), `"nowhere.test"`) {
		t.Errorf("error %q: want ErrUnresolved naming nowhere.test", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q is not one line", err)
	}
	empty := fakeResolver{"nowhere.test": {}}
	if _, err := Compile(t.Context(), n, empty); !errors.Is(err, ErrUnresolved) {
		t.Errorf("a name with no address: %v, want ErrUnresolved", err)
	}
}

func TestTupleLinkLocal(t *testing.T) {
	for p, want := range map[string]bool{
		"169.254.169.254/32": true,
		"169.254.0.0/16":     true,
		"169.0.0.0/8":        false, // covers link-local, but not on purpose
		"0.0.0.0/0":          false,
		"10.0.0.1/32":        false,
		"fe80::1/128":        true,
		"fe80::/10":          true,
		"::/0":               false,
	} {
		if got := (Tuple{Prefix: netip.MustParsePrefix(p)}).LinkLocal(); got != want {
			t.Errorf("%s: LinkLocal %v, want %v", p, got, want)
		}
	}
}

func TestRulesLines(t *testing.T) {
	r, err := Compile(t.Context(), network(t, "network: {egress: {allow: [169.254.169.254:80, 10.0.0.0/8]}, dns: none}"), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := r.Lines([]netip.Addr{netip.MustParseAddr("10.0.0.1")})
	want := []string{
		"drop DNS to 10.0.0.1 (dns: none)",
		"accept tcp+udp 169.254.169.254 port 80 (allow 169.254.169.254:80)",
		"drop link-local 169.254.0.0/16",
		"drop link-local fe80::/10",
		"accept tcp+udp 10.0.0.0/8 any port (allow 10.0.0.0/8)",
		"drop everything else (egress: allow)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestCheckUserChange(t *testing.T) {
	none := Rules{Mode: contract.EgressNone, DNS: contract.DNSNone}
	noneDNS := Rules{Mode: contract.EgressNone, DNS: contract.DNSHost}
	all := Rules{Mode: contract.EgressAll, DNS: contract.DNSHost}
	if err := CheckUserChange(none, noneDNS); !errors.Is(err, ErrRestricted) {
		t.Errorf("widening a restricted machine: %v, want ErrRestricted", err)
	}
	if err := CheckUserChange(none, none); err != nil {
		t.Errorf("the same contract: %v", err)
	}
	if err := CheckUserChange(all, none); err != nil {
		t.Errorf("narrowing: %v (the host's rules do it; restrict=on stays off)", err)
	}
}
