package broker

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/contract"
)

// The test servers' names: every *.test name resolves to 127.0.0.1 in
// these tests (Options.LookupNetIP), and the test CA's server
// certificate holds these names.
const (
	apiHost   = "api.test"   // the host the secrets are bound to
	otherHost = "other.test" // a host no secret is bound to
)

// hook is the exec hook of the tests: a value of the machine's own.
const hook = `printf 'value-of-%s\n' "$VMFORK_NAME"`

func valueOf(name string) string { return "value-of-" + name }

func lookupTest(_ context.Context, host string) ([]netip.Addr, error) {
	if strings.HasSuffix(host, ".test") {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// loopbackEgress lets a machine reach the test servers, on the host's
// loopback (which egress all does not: see egressAllows).
func loopbackEgress(t testing.TB) *contract.Egress {
	t.Helper()
	d, err := contract.ParseDest("127.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	return &contract.Egress{Mode: contract.EgressAllow, Allow: []contract.Dest{d}}
}

// testPKI is a CA of the tests' own, standing for a public CA, and a
// server certificate it signed for the test names.
type testPKI struct {
	root *x509.Certificate
	cert tls.Certificate
}

func newTestPKI(t testing.TB) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test public CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: apiHost},
		DNSNames:  []string{apiHost, otherHost},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return testPKI{root: root, cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}
}

// seen is one request as a test server got it.
type seen struct {
	Host   string
	Header http.Header
	Query  string
	Body   string
}

// apiServer is a test server that records what it gets and answers "ok".
type apiServer struct {
	*httptest.Server
	mu  sync.Mutex
	got []seen
}

func newAPIServer(t testing.TB, pki *testPKI) *apiServer {
	t.Helper()
	s := &apiServer{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.got = append(s.got, seen{Host: r.Host, Header: r.Header.Clone(), Query: r.URL.RawQuery, Body: string(body)})
		s.mu.Unlock()
		w.Header().Set("X-Served-By", "api")
		io.WriteString(w, "ok\n")
	})
	s.Server = httptest.NewUnstartedServer(h)
	// A tunnel the test closes mid-handshake is no news.
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	if pki == nil {
		s.Start()
	} else {
		s.TLS = &tls.Config{Certificates: []tls.Certificate{pki.cert}}
		s.StartTLS()
	}
	t.Cleanup(s.Close)
	return s
}

// last is the last request the server got.
func (s *apiServer) last(t *testing.T) seen {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.got) == 0 {
		t.Fatal("the server got no request")
	}
	return s.got[len(s.got)-1]
}

func (s *apiServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

// urlAt is the server's URL under host name: scheme://host:port/path.
func (s *apiServer) urlAt(host, path string) string {
	u, _ := url.Parse(s.URL)
	return u.Scheme + "://" + host + ":" + u.Port() + path
}

// guestClient is what a guest's program does: every request through its
// proxy at a, trusting roots.
func guestClient(a Addr, roots ...*x509.Certificate) *http.Client {
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	return &http.Client{
		Transport: &http.Transport{
			Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy.guest:3128"}),
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, a.Network, a.Address)
			},
			TLSClientConfig:   &tls.Config{RootCAs: pool},
			DisableKeepAlives: true,
		},
		Timeout: 20 * time.Second,
	}
}

// bearer is the guest's Authorization header: its program formats the
// placeholder as it would the token.
func bearer(ph string) string { return "Bearer " + ph }

// testLog sends a broker's log to the test's.
func testLog(t testing.TB) *logrus.Entry {
	l := logrus.New()
	l.SetOutput(testWriter{t})
	l.SetLevel(logrus.DebugLevel)
	return logrus.NewEntry(l)
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// sockPath is a unix socket path short enough for sun_path.
func sockPath(t testing.TB, name string) string {
	t.Helper()
	dir, err := shortTempDir(t)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, name)
}

func shortTempDir(t testing.TB) (string, error) {
	dir := t.TempDir()
	if len(dir) < 80 {
		return dir, nil
	}
	d, err := os.MkdirTemp("", "vb")
	if err == nil {
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	return d, err
}
