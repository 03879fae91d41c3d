package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestParseDest(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"api.example.com:443", "api.example.com:443"},
		{"API.Example.com.:*", "api.example.com:*"},
		{"10.0.0.0/8", "10.0.0.0/8"},
		{"10.0.0.0/8:5432", "10.0.0.0/8:5432"},
		{"10.1.2.3", "10.1.2.3"},
		{"10.1.2.3:53", "10.1.2.3:53"},
		{"10.1.2.3:*", "10.1.2.3"},
		{"2001:db8::/32", "2001:db8::/32"},
		{"[2001:db8::/32]:443", "[2001:db8::/32]:443"},
		{"[2001:db8::1]:443", "[2001:db8::1]:443"},
		{"fe80::1", "fe80::1"},
	} {
		d, err := ParseDest(c.in)
		if err != nil {
			t.Errorf("ParseDest(%q): %v", c.in, err)
			continue
		}
		if got := d.String(); got != c.want {
			t.Errorf("ParseDest(%q) = %q, want %q", c.in, got, c.want)
		}
		if again, err := ParseDest(d.String()); err != nil || again != d {
			t.Errorf("ParseDest(%q) does not round-trip: %+v, %v", d.String(), again, err)
		}
	}
	for _, in := range []string{
		"", "api.example.com", "10.0.0.0/33", "10.0.0.1/8", "10.0.0.0/8:0", "host:70000", "host:x",
		"bad_host:80", "[2001:db8::1", "[2001:db8::1]443", "-a.example:80", "10.0.0.0/8/8:80", "*.example.com:443",
	} {
		if d, err := ParseDest(in); err == nil {
			t.Errorf("ParseDest(%q) = %+v, want an error", in, d)
		}
	}
}

const fullYAML = `
network:
  egress:
    allow: [api.example.com:443, "10.0.0.0/8:5432", 192.168.7.0/24]
  dns: none
  connections: keep
secrets:
  GITHUB_TOKEN:
    hosts: [API.github.com]
    header: Authorization
    format: "Bearer {value}"
    value_from: {exec: "mint-token --for $VMFORK_NAME"}
  DB_PASS:
    hosts: [db.example.com]
    value_from: {env: DB_PASS}
secret_files:
  wipe: [/var/cache/app/session, "/home/app/my cookies"]
  rotate:
    /etc/app/token: {exec: 'echo "tok-$VMFORK_NAME"'}
    /etc/app/db pass: {exec: mint-db-pass}
`

func TestParseYAMLAndJSONAgree(t *testing.T) {
	c, err := ParseYAML([]byte(fullYAML))
	if err != nil {
		t.Fatal(err)
	}
	n := c.Network
	if n.Egress.Mode != EgressAllow || len(n.Egress.Allow) != 3 || n.DNS != DNSNone || n.Connections != ConnKeep {
		t.Fatalf("network = %+v", n)
	}
	gh := c.Secrets["GITHUB_TOKEN"]
	if gh.Hosts[0] != "api.github.com" || gh.Format != "Bearer {value}" || gh.ValueFrom.Exec == "" {
		t.Errorf("GITHUB_TOKEN = %+v", gh)
	}
	if db := c.Secrets["DB_PASS"]; db.Header != "Authorization" || db.Format != "{value}" {
		t.Errorf("DB_PASS defaults = %+v", db)
	}
	if f := c.SecretFiles; f == nil || len(f.Wipe) != 2 || f.Wipe[1] != "/home/app/my cookies" ||
		f.Rotate["/etc/app/token"].Exec != `echo "tok-$VMFORK_NAME"` || strings.Join(f.RotatePaths(), ",") != "/etc/app/db pass,/etc/app/token" {
		t.Errorf("secret_files = %+v", f)
	}
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"egress":{"allow":["api.example.com:443","10.0.0.0/8:5432","192.168.7.0/24"]}`) ||
		!strings.Contains(string(js), `"secret_files":{"wipe":["/var/cache/app/session","/home/app/my cookies"],"rotate":{"/etc/app/db pass":{"exec":"mint-db-pass"},`) {
		t.Errorf("JSON = %s", js)
	}
	back, err := ParseJSON(js)
	if err != nil {
		t.Fatal(err)
	}
	js2, _ := json.Marshal(back)
	if string(js) != string(js2) {
		t.Errorf("JSON round trip:\n%s\n%s", js, js2)
	}
	y, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseYAML(y)
	if err != nil {
		t.Fatalf("YAML round trip: %v\n%s", err, y)
	}
	if js3, _ := json.Marshal(again); string(js3) != string(js) {
		t.Errorf("YAML round trip:\n%s\n%s", js, js3)
	}
}

func TestDefaults(t *testing.T) {
	for _, in := range []string{"network: {egress: none}", `{"network": {"egress": "none"}}`} {
		var c *Contract
		var err error
		if strings.HasPrefix(in, "{\"") {
			c, err = ParseJSON([]byte(in))
		} else {
			c, err = ParseYAML([]byte(in))
		}
		if err != nil {
			t.Fatal(err)
		}
		if n := c.Network; n.Egress.Mode != EgressNone || n.DNS != DNSHost || n.Connections != ConnReset {
			t.Errorf("%s: network = %+v, want egress none, dns host, connections reset", in, n)
		}
	}
	var none *Contract
	if none.Enforced() || (&Contract{}).Enforced() || none.NetworkOf().Connections != ConnKeep {
		t.Error("a nil or empty contract must enforce nothing and keep connections")
	}
	// secret_files alone is a contract; one that lists nothing is none.
	for in, want := range map[string]bool{
		"secret_files: {wipe: [/etc/x]}":                         true,
		`{"secret_files": {"rotate": {"/x": {"exec": "true"}}}}`: true,
		"secret_files: {}":                                       false,
		"secret_files: {wipe: [], rotate: {}}":                   false,
	} {
		c, err := ParseYAML([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if c.Enforced() != want || (!want && c.SecretFiles != nil) {
			t.Errorf("%s: Enforced() = %v, secret_files %+v; want %v", in, c.Enforced(), c.SecretFiles, want)
		}
	}
}

// Bad input: one error naming the field, wrapping ErrInvalid.
func TestBadContracts(t *testing.T) {
	for _, c := range []struct{ in, field string }{
		{"network: {egress: some}", "network.egress"},
		{"network: {egress: {allow: []}}", "network.egress.allow"},
		{"network: {egress: {allow: [api.example.com]}}", "network.egress.allow[0]"},
		{"network: {egress: {allow: [10.0.0.0/8, 10.0.0.300/8]}}", "network.egress.allow[1]"},
		{"network: {egress: {allow: [host:99999]}}", "network.egress.allow[0]"},
		{"network: {egress: {deny: [10.0.0.0/8]}}", "network.egress"},
		{"network: {egress: none, dns: google}", "network.dns"},
		{"network: {egress: none, connections: drop}", "network.connections"},
		{"network: {egress: none, firewall: on}", "firewall"},
		{"netwrok: {egress: none}", "netwrok"},
		{"secrets: {TOKEN: {value_from: {env: T}}}", "secrets.TOKEN.hosts"},
		{"secrets: {TOKEN: {hosts: [], value_from: {env: T}}}", "secrets.TOKEN.hosts"},
		{"secrets: {token: {hosts: [a.example], value_from: {env: T}}}", "secrets.token"},
		{"secrets: {TOKEN: {hosts: [a.example], value_from: {}}}", "secrets.TOKEN.value_from"},
		{"secrets: {TOKEN: {hosts: [a.example], value_from: {env: T, file: /x}}}", "secrets.TOKEN.value_from"},
		{"secrets: {TOKEN: {hosts: [a.example], value_from: {file: rel/x}}}", "secrets.TOKEN.value_from.file"},
		{"secrets: {TOKEN: {hosts: [a.example], format: Bearer, value_from: {env: T}}}", "secrets.TOKEN.format"},
		{"secrets: {TOKEN: {hosts: [a.example], header: 'Bad Header', value_from: {env: T}}}", "secrets.TOKEN.header"},
		{"secrets: {TOKEN: {hosts: [10.0.0.1], value_from: {env: T}}}", "secrets.TOKEN.hosts[0]"},
		{"secret_files: {wipe: [etc/x]}", "secret_files.wipe[0]"},
		{"secret_files: {wipe: [/etc/x, /etc/../shadow]}", "secret_files.wipe[1]"},
		{"secret_files: {wipe: [/etc/x/]}", "secret_files.wipe[0]"},
		{"secret_files: {wipe: [/etc//x]}", "secret_files.wipe[0]"},
		{"secret_files: {wipe: [/]}", "secret_files.wipe[0]"},
		{"secret_files: {wipe: [\"/etc/a\\nb\"]}", "secret_files.wipe[0]"},
		{"secret_files: {wipe: [/etc/x, /etc/y, /etc/x]}", "secret_files.wipe[2]"},
		{"secret_files: {rotate: {etc/token: {exec: x}}}", "secret_files.rotate.etc/token"},
		{"secret_files: {rotate: {/etc/a/../token: {exec: x}}}", "secret_files.rotate./etc/a/../token"},
		{"secret_files: {rotate: {/etc/app/token: {exec: ''}}}", "secret_files.rotate./etc/app/token.exec"},
		{"secret_files: {rotate: {/etc/app/token: {}}}", "secret_files.rotate./etc/app/token.exec"},
		{"secret_files: {rotate: {/etc/app/token: {exec: x, env: Y}}}", "env"},
		{"secret_files: {wipe: [/etc/app/token], rotate: {/etc/app/token: {exec: x}}}", "secret_files.rotate./etc/app/token"},
		{"secret_files: {shred: [/etc/x]}", "shred"},
	} {
		_, err := ParseYAML([]byte(c.in))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.field) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseYAML(%q) = %v, want one line naming %s", c.in, err, c.field)
		}
	}
	if _, err := ParseJSON([]byte(`{"network": {"egress": "none"}, "extra": 1}`)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "extra") {
		t.Errorf("ParseJSON with an unknown key: %v", err)
	}
	for in, field := range map[string]string{
		`{"secret_files": {"rotate": {"/etc/app/token": {"exec": " "}}}}`: "secret_files.rotate./etc/app/token.exec",
		`{"secret_files": {"rotate": {"/etc/app/token": {"cmd": "x"}}}}`:  "cmd",
		`{"secret_files": {"wipe": ["/a", "/a"]}}`:                        "secret_files.wipe[1]",
	} {
		if _, err := ParseJSON([]byte(in)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), field) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseJSON(%s) = %v, want one line naming %s", in, err, field)
		}
	}
	var many strings.Builder
	for i := range maxSecretFiles + 1 {
		fmt.Fprintf(&many, "/f%d,", i)
	}
	if _, err := ParseYAML([]byte("secret_files: {wipe: [" + strings.TrimSuffix(many.String(), ",") + "]}")); err == nil || !strings.Contains(err.Error(), "secret_files: lists 65 files") {
		t.Errorf("too many files: %v", err)
	}
}

func TestLoadAndClone(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(f, []byte(fullYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	d := c.Clone()
	d.Network.Egress.Allow[0].Port = 1
	d.Secrets["DB_PASS"].Hosts[0] = "other.example"
	d.SecretFiles.Wipe[0] = "/other"
	d.SecretFiles.Rotate["/etc/app/token"] = Rotate{Exec: "other"}
	if c.Network.Egress.Allow[0].Port != 443 || c.Secrets["DB_PASS"].Hosts[0] != "db.example.com" ||
		c.SecretFiles.Wipe[0] != "/var/cache/app/session" || c.SecretFiles.Rotate["/etc/app/token"].Exec == "other" {
		t.Error("Clone shares memory with its original")
	}
	if got := c.SecretNames(); strings.Join(got, ",") != "DB_PASS,GITHUB_TOKEN" {
		t.Errorf("SecretNames = %v", got)
	}
	if _, err := Load(filepath.Join(dir, "none.yaml")); err == nil {
		t.Error("Load of a missing file: nil error")
	}
}

func TestJSONErrorSaysInvalidOnce(t *testing.T) {
	_, err := ParseJSON([]byte(`{"network": {"egress": {"allow": ["10.0.0.0/33"]}}}`))
	if err == nil || strings.Count(err.Error(), "invalid contract") != 1 || !strings.Contains(err.Error(), "network.egress.allow[0]") {
		t.Errorf("ParseJSON of a bad entry: %v, want one line naming the entry, saying invalid once", err)
	}
}
