package broker

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/vmfork/vmfork/contract"
)

// placeholderPrefix starts every placeholder.
const placeholderPrefix = "vmfork-secret-"

// placeholderRE is a placeholder: the prefix, the secret's name (as the
// contract allows it: capitals, digits, '_') and 16 random hex digits.
var placeholderRE = regexp.MustCompile(`^vmfork-secret-[A-Z_][A-Z0-9_]{0,63}-[0-9a-f]{16}$`)

// NewPlaceholder returns a fresh placeholder for secret name: what the
// guest holds instead of the value. It names the secret, so a user
// reading a request or a log knows what it stands for, and ends in 64
// random bits, so it occurs nowhere by accident and tells nothing of the
// value (it is not derived from it). Make one per child and secret, when
// the child is made, and keep it for the child's life: the guest has it
// in files (GuestFiles) and in the memory of its programs.
func NewPlaceholder(name string) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("placeholder for %s: %w", name, err)
	}
	p := placeholderPrefix + name + "-" + hex.EncodeToString(b[:])
	if !placeholderRE.MatchString(p) {
		return "", fmt.Errorf("placeholder: %q is not a secret's name: %w", name, contract.ErrInvalid)
	}
	return p, nil
}

// Placeholders returns a fresh placeholder for each of names (a
// contract's SecretNames), by name.
func Placeholders(names []string) (map[string]string, error) {
	out := make(map[string]string, len(names))
	for _, n := range names {
		p, err := NewPlaceholder(n)
		if err != nil {
			return nil, err
		}
		out[n] = p
	}
	return out, nil
}

// Paths in the guest. GuestFiles makes their contents; the machine's
// identity step writes them before the guest runs anything else.
const (
	// GuestDir holds what the guest knows of its brokered secrets.
	GuestDir = "/etc/vmfork"
	// GuestEnvFile is a KEY=VALUE file (for sh's `set -a; . FILE` and
	// systemd's EnvironmentFile=): each secret's NAME=placeholder, then
	// the proxy settings (HTTPS_PROXY, HTTP_PROXY, NO_PROXY, in both
	// cases, and NODE_EXTRA_CA_CERTS).
	GuestEnvFile = GuestDir + "/secrets.env"
	// GuestSecretsDir holds a file per secret, named after it, holding
	// its placeholder (no trailing newline), for programs that read a
	// token from a file.
	GuestSecretsDir = GuestDir + "/secrets"
	// GuestCAFile is vmfork's CA certificate (PEM), for programs that
	// take a CA file rather than the system trust store.
	GuestCAFile = GuestDir + "/ca.pem"
)

// Guest is what GuestFiles writes for one child.
type Guest struct {
	// Placeholders are the child's placeholders, by secret name.
	Placeholders map[string]string
	// ProxyURL is the child's proxy as the guest reaches it
	// (http://10.0.2.100:3128): the address its listener is forwarded to.
	ProxyURL string
	// NoProxy are hosts the guest reaches without the proxy, besides
	// localhost, 127.0.0.1 and ::1 (always listed). A host a secret is
	// bound to must not be among them.
	NoProxy []string
	// CAPEM is vmfork's CA certificate (CA.PEM).
	CAPEM []byte
}

// GuestFiles returns the files the guest gets, by absolute path: the
// environment file, a file per secret and the CA certificate. None holds
// a value, so they may be world-readable (0644). The CA must also go into
// the guest's trust store (see TrustStoreOf).
func GuestFiles(g Guest) (map[string][]byte, error) {
	u, err := url.Parse(g.ProxyURL)
	if err != nil || u.Scheme != "http" || u.Host == "" || u.Path != "" && u.Path != "/" || u.User != nil {
		return nil, fmt.Errorf("guest files: proxy URL %q: want http://HOST:PORT: %w", g.ProxyURL, contract.ErrInvalid)
	}
	if len(g.CAPEM) == 0 {
		return nil, fmt.Errorf("guest files: no CA certificate: %w", contract.ErrInvalid)
	}
	names := make([]string, 0, len(g.Placeholders))
	for n := range g.Placeholders {
		names = append(names, n)
	}
	slices.Sort(names)
	files := map[string][]byte{GuestCAFile: g.CAPEM}
	var env strings.Builder
	env.WriteString("# Written by vmfork: brokered secrets (placeholders; the host adds the values) and their proxy.\n")
	for _, n := range names {
		p := g.Placeholders[n]
		if !placeholderRE.MatchString(p) || !strings.HasPrefix(p, placeholderPrefix+n+"-") {
			return nil, fmt.Errorf("guest files: secret %s: %q is not its placeholder: %w", n, p, contract.ErrInvalid)
		}
		fmt.Fprintf(&env, "%s=%s\n", n, p)
		files[path.Join(GuestSecretsDir, n)] = []byte(p)
	}
	proxy := u.Scheme + "://" + u.Host
	noProxy := append([]string{"localhost", "127.0.0.1", "::1"}, g.NoProxy...)
	for _, h := range noProxy {
		if strings.ContainsAny(h, " \t\n\"'$`\\,") {
			return nil, fmt.Errorf("guest files: no_proxy entry %q: %w", h, contract.ErrInvalid)
		}
	}
	// Both cases: curl reads only the lower-case http_proxy, most others
	// the upper case.
	for _, k := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"} {
		fmt.Fprintf(&env, "%s=%s\n", k, proxy)
	}
	for _, k := range []string{"NO_PROXY", "no_proxy"} {
		fmt.Fprintf(&env, "%s=%s\n", k, strings.Join(noProxy, ","))
	}
	// Node.js has its own CA list and adds this file to it.
	fmt.Fprintf(&env, "NODE_EXTRA_CA_CERTS=%s\n", GuestCAFile)
	files[GuestEnvFile] = []byte(env.String())
	return files, nil
}

// TrustStore is where a guest family keeps an added CA certificate and
// the command that rebuilds its trust bundle from there.
type TrustStore struct {
	// File is where the CA certificate (PEM) goes.
	File string
	// Bundle is the file of every trusted certificate (PEM) that Update
	// writes and programs read. The secrets step appends the CA to it
	// itself: Update rebuilds every certificate's links, a minute and more
	// of a fresh child's time under TCG; run later, it keeps the CA, which
	// it finds in File.
	Bundle string
	// Update is the command (argv) that adds it to the bundle programs
	// read.
	Update []string
}

// trustStores by guest family (os-release ID or ID_LIKE).
var trustStores = map[string]TrustStore{
	// ca-certificates: only *.crt files under this directory are read.
	"debian": {File: "/usr/local/share/ca-certificates/vmfork.crt", Bundle: "/etc/ssl/certs/ca-certificates.crt", Update: []string{"update-ca-certificates"}},
	// Alpine's ca-certificates package works as Debian's.
	"alpine": {File: "/usr/local/share/ca-certificates/vmfork.crt", Bundle: "/etc/ssl/certs/ca-certificates.crt", Update: []string{"update-ca-certificates"}},
	// p11-kit's anchors: Fedora, RHEL, CentOS, Rocky, Alma.
	"fedora": {File: "/etc/pki/ca-trust/source/anchors/vmfork.pem", Bundle: "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", Update: []string{"update-ca-trust", "extract"}},
	// openSUSE and SLES.
	"suse": {File: "/etc/pki/trust/anchors/vmfork.pem", Bundle: "/var/lib/ca-certificates/ca-bundle.pem", Update: []string{"update-ca-certificates"}},
	// Arch: p11-kit too, under another directory.
	"arch": {File: "/etc/ca-certificates/trust-source/anchors/vmfork.pem", Bundle: "/etc/ca-certificates/extracted/tls-ca-bundle.pem", Update: []string{"update-ca-trust"}},
}

// familyAliases map os-release IDs to the family whose trust store they
// share.
var familyAliases = map[string]string{
	"ubuntu": "debian", "rhel": "fedora", "centos": "fedora", "rocky": "fedora", "almalinux": "fedora",
	"opensuse": "suse", "opensuse-leap": "suse", "opensuse-tumbleweed": "suse", "sles": "suse",
}

// NamedTrustStore is a TrustStore with the os-release ID it serves.
type NamedTrustStore struct {
	ID string
	TrustStore
}

// TrustStores lists every os-release ID vmfork knows a trust store for
// (aliases too), sorted by ID.
func TrustStores() []NamedTrustStore {
	var out []NamedTrustStore
	for id, ts := range trustStores {
		out = append(out, NamedTrustStore{id, ts})
	}
	for id, fam := range familyAliases {
		out = append(out, NamedTrustStore{id, trustStores[fam]})
	}
	slices.SortFunc(out, func(a, b NamedTrustStore) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// TrustStoreOf returns the trust store of a guest whose os-release ID
// (or one of its ID_LIKE words) is id; ok is false for a family vmfork
// does not know, whose guests must be given the CA by hand.
func TrustStoreOf(id string) (ts TrustStore, ok bool) {
	id = strings.ToLower(strings.TrimSpace(id))
	if a, found := familyAliases[id]; found {
		id = a
	}
	ts, ok = trustStores[id]
	return ts, ok
}
