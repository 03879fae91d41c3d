//go:build integration

package tests

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// tokenServer is an HTTPS test server on the host's loopback that records
// the Authorization header of each request and never echoes it.
type tokenServer struct {
	*httptest.Server
	mu  sync.Mutex
	got []string
}

func (s *tokenServer) saw() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

// testCA makes a CA standing for a public one, and server certificates of
// it for names; it writes the CA's PEM to a file and returns it.
func newTokenServers(t *testing.T, names ...string) (map[string]*tokenServer, string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vmfork test public CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := x509.ParseCertificate(caDER)
	caFile := filepath.Join(t.TempDir(), "test-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	out := map[string]*tokenServer{}
	for i, name := range names {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, root, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		s := &tokenServer{}
		s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.mu.Lock()
			s.got = append(s.got, r.Header.Get("Authorization"))
			s.mu.Unlock()
			io.WriteString(w, "ok\n")
		}))
		s.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
		s.StartTLS()
		t.Cleanup(s.Close)
		out[name] = s
	}
	return out, caFile
}

// portOf is the server's port.
func portOf(s *httptest.Server) string {
	return s.URL[strings.LastIndex(s.URL, ":")+1:]
}

// ramHolds reports whether the guest RAM of QEMU process pid holds any of
// values: the mappings of its RAM file (a child maps its template's
// privately), read through /proc/PID/mem.
func ramHolds(t *testing.T, pid int, ramFile string, values ...string) []string {
	t.Helper()
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer maps.Close()
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	var found []string
	sc := bufio.NewScanner(maps)
	read := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || !strings.HasPrefix(f[5], ramFile) {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, _ := strconv.ParseUint(lo, 16, 64)
		end, _ := strconv.ParseUint(hi, 16, 64)
		buf := make([]byte, 4<<20)
		for off := start; off < end; off += uint64(len(buf)) {
			n, _ := mem.ReadAt(buf[:min(uint64(len(buf)), end-off)], int64(off))
			read += n
			for _, v := range values {
				if bytes.Contains(buf[:n], []byte(v)) {
					found = append(found, v)
				}
			}
		}
	}
	if read == 0 {
		t.Fatalf("pid %d: no mapping of %s read: the search proves nothing", pid, ramFile)
	}
	return found
}

// fileHolds lists the files under dir holding any of values.
func fileHolds(t *testing.T, dir string, values ...string) []string {
	t.Helper()
	var found []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for _, v := range values {
			if bytes.Contains(b, []byte(v)) {
				found = append(found, p+": "+v)
			}
		}
		return nil
	})
	return found
}

// TestContractSecretsDebian is issue 22's brokered secret on the Debian
// guest: two children curl an HTTPS server that checks a token, each
// request arrives with that child's own value from the exec hook; a
// request to a host the secret is not bound to carries the placeholder
// only; the values' bytes are in no file of the template nor in either
// child's RAM.
func TestContractSecretsDebian(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newDebianEnv(t)
	id := filepath.Base(e.stateDir)
	apiName, otherName := "api-"+id+".invalid", "other-"+id+".invalid"
	apiName, otherName = strings.ToLower(apiName), strings.ToLower(otherName)
	servers, caFile := newTokenServers(t, apiName, otherName)
	hostsEntry(t, "127.0.0.1", apiName)
	hostsEntry(t, "127.0.0.1", otherName)
	// The broker, started by the fork, verifies the servers' certificates
	// against the host's store and this test CA.
	e.env = e.env.withEnv("VMFORK_BROKER_EXTRA_ROOTS=" + caFile)
	c := filepath.Join(t.TempDir(), "secret.yaml")
	// The servers listen on the host's loopback, which a child's proxy
	// reaches only where its egress names it (no guest on a network could).
	os.WriteFile(c, []byte(`network:
  egress:
    allow: [`+apiName+`:`+portOf(servers[apiName].Server)+`, `+otherName+`:`+portOf(servers[otherName].Server)+`]
secrets:
  TOKEN:
    hosts: [`+apiName+`]
    format: "Bearer {value}"
    value_from: {exec: 'printf "val-%s-%s" "$VMFORK_NAME" "$VMFORK_INDEX"'}
`), 0o600)

	e.forkDebian("deb") // from the shared template (tests/doc.go)
	e.settle("deb")
	var fr forkJSON
	e.jsonOK(&fr, "fork", "deb", "deb-1", "deb-2", "--contract", c)
	values := []string{"val-deb-1-1", "val-deb-2-2"}
	curl := func(name, host string, port string, insecure bool) string {
		k := ""
		if insecure {
			k = "-k "
		}
		return e.exec(name, "sh", "-c", fmt.Sprintf(`set -a; . /etc/vmfork/secrets.env; set +a; curl -sS %s-m 30 -H "Authorization: Bearer $TOKEN" https://%s:%s/check`, k, host, port))
	}
	for i, name := range []string{"deb-1", "deb-2"} {
		out := curl(name, apiName, portOf(servers[apiName].Server), false)
		if strings.TrimSpace(out) != "ok" {
			t.Fatalf("%s: curl to the bound host answered %q", name, out)
		}
		got := servers[apiName].saw()
		if want := "Bearer " + values[i]; len(got) != i+1 || got[i] != want {
			t.Errorf("%s: the bound host got %q, want %q last", name, got, want)
		}
		// Not bound: a tunnel the broker never opens (-k: the guest does
		// not know the test CA), with the placeholder alone.
		ph := strings.TrimSpace(e.exec(name, "cat", "/etc/vmfork/secrets/TOKEN"))
		curl(name, otherName, portOf(servers[otherName].Server), true)
		if got := servers[otherName].saw(); len(got) != i+1 || got[i] != "Bearer "+ph || !strings.HasPrefix(ph, "vmfork-secret-TOKEN-") {
			t.Errorf("%s: the unbound host got %q, want its placeholder %q", name, got, ph)
		}
	}
	// The values are nowhere a guest or a template could keep them (the
	// shared template imported in this store included).
	if found := fileHolds(t, filepath.Join(e.stateDir, "templates"), values...); len(found) > 0 {
		t.Errorf("template files hold a value: %v", found)
	}
	if found := fileHolds(t, e.memDir, values...); len(found) > 0 {
		t.Errorf("RAM files hold a value: %v", found)
	}
	for _, ch := range fr.Children {
		m := e.machine(ch.Name)
		if found := ramHolds(t, ch.PID, m.RAM, values...); len(found) > 0 {
			t.Errorf("%s's RAM holds %v", ch.Name, found)
		}
	}
	// The parent has no secrets: no placeholder files, and its curl gets
	// no value.
	if r := e.vmfork("exec", "deb", "--", "test", "-e", "/etc/vmfork/secrets.env"); r.code == 0 {
		t.Error("the parent got the children's secrets file")
	}
	e.ok("rm", "deb-1", "deb-2")
}
