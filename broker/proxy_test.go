package broker

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmfork/vmfork/contract"
)

// rig is a host with vmfork's CA, two HTTPS test servers (api.test, to
// which the secrets are bound, and other.test) and a plain HTTP one.
type rig struct {
	t     testing.TB
	pki   testPKI
	ca    *CA
	api   *apiServer
	other *apiServer
	plain *apiServer
	opts  Options
	index int
}

func newRig(t testing.TB) *rig {
	t.Helper()
	pki := newTestPKI(t)
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &rig{
		t: t, pki: pki, ca: ca,
		api: newAPIServer(t, &pki), other: newAPIServer(t, &pki), plain: newAPIServer(t, nil),
		opts: Options{ExtraRoots: []*x509.Certificate{pki.root}, LookupNetIP: lookupTest},
	}
}

// child is machine name, listening at listen, with secret TOKEN bound
// to api.test: its value (the hook's) is resolved as the Manager would.
// It returns the machine and its placeholder.
func (r *rig) child(name string, listen Addr) (Child, string) {
	r.t.Helper()
	ph, err := NewPlaceholder("TOKEN")
	if err != nil {
		r.t.Fatal(err)
	}
	s := contract.Secret{Hosts: []string{apiHost}, Header: "Authorization", Format: "Bearer {value}",
		ValueFrom: contract.ValueFrom{Exec: hook}}
	info := ChildInfo{Name: name, Parent: "parent", Index: r.index}
	r.index++
	v, err := Resolve(r.t.Context(), "TOKEN", s, info, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	return Child{ChildInfo: info, Listen: listen, Egress: loopbackEgress(r.t),
		Secrets: []Binding{{Name: "TOKEN", Secret: s, Placeholder: ph, Value: v}}}, ph
}

// serve starts c's proxy on a listener of its own and returns where.
func (r *rig) serve(c Child) (Addr, *Proxy) {
	r.t.Helper()
	ln, err := listenAddr(c.Listen)
	if err != nil {
		r.t.Fatal(err)
	}
	p, err := NewProxy(r.ca, c, r.opts)
	if err != nil {
		ln.Close()
		r.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	r.t.Cleanup(func() {
		p.Close()
		if err := <-done; err != nil {
			r.t.Errorf("Serve: %v", err)
		}
	})
	return Addr{Network: c.Listen.Network, Address: ln.Addr().String()}, p
}

// guest is a guest's HTTP client through its proxy at a, trusting the
// public test CA and vmfork's.
func (r *rig) guest(a Addr) *http.Client { return guestClient(a, r.pki.root, r.ca.Certificate()) }

// do sends a request and returns the response with its body read.
func do(t *testing.T, c *http.Client, method, url string, header map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// issuer is the issuer of the certificate the guest's client saw.
func issuer(t *testing.T, resp *http.Response) string {
	t.Helper()
	if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 {
		t.Fatal("no TLS peer certificate")
	}
	return resp.TLS.PeerCertificates[0].Issuer.CommonName
}

// noValueIn fails if any value appears in what the guest got back.
func noValueIn(t *testing.T, resp *http.Response, body string, values ...string) {
	t.Helper()
	for _, v := range values {
		if strings.Contains(body, v) {
			t.Errorf("the guest's response body holds value %q: %q", v, body)
		}
		for k, vs := range resp.Header {
			if strings.Contains(strings.Join(vs, ","), v) {
				t.Errorf("the guest's response header %s holds value %q", k, v)
			}
		}
	}
}

func TestEachChildGetsItsOwnValue(t *testing.T) {
	r := newRig(t)
	a, pha := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	b, phb := r.child("b", Addr{Network: "unix", Address: sockPath(t, "b.sock")})
	addrA, _ := r.serve(a)
	addrB, _ := r.serve(b)
	for _, tc := range []struct {
		name string
		addr Addr
		ph   string
	}{{"a", addrA, pha}, {"b", addrB, phb}} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, r.guest(tc.addr), "GET", r.api.urlAt(apiHost, "/v1/x"), map[string]string{"Authorization": bearer(tc.ph)}, "")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if got, want := r.api.last(t).Header.Get("Authorization"), "Bearer "+valueOf(tc.name); got != want {
				t.Errorf("the server got Authorization %q, want %q", got, want)
			}
			// The guest talked TLS with the broker, for api.test.
			if got, want := issuer(t, resp), r.ca.Certificate().Subject.CommonName; got != want {
				t.Errorf("the guest saw a certificate issued by %q, want vmfork's CA %q", got, want)
			}
			noValueIn(t, resp, body, valueOf("a"), valueOf("b"))
		})
	}
}

func TestChildCannotUseAnothersPlaceholder(t *testing.T) {
	r := newRig(t)
	a, _ := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	b, phb := r.child("b", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	addrA, _ := r.serve(a)
	r.serve(b)
	// a's guest learnt b's placeholder (it is no secret) and sends it
	// through its own proxy: it is a's connection, and b's value is not a's.
	resp, body := do(t, r.guest(addrA), "GET", r.api.urlAt(apiHost, "/"), map[string]string{"Authorization": bearer(phb)}, "")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got, want := r.api.last(t).Header.Get("Authorization"), bearer(phb); got != want {
		t.Errorf("the server got Authorization %q, want the placeholder unchanged %q", got, want)
	}
}

func TestUnboundHostIsTunneledWithThePlaceholder(t *testing.T) {
	r := newRig(t)
	a, ph := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	addr, _ := r.serve(a)
	resp, body := do(t, r.guest(addr), "GET", r.other.urlAt(otherHost, "/"), map[string]string{"Authorization": bearer(ph)}, "")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got, want := r.other.last(t).Header.Get("Authorization"), bearer(ph); got != want {
		t.Errorf("other.test got Authorization %q, want the placeholder %q", got, want)
	}
	// Not terminated by the broker: the guest saw the server's own
	// certificate, from the public CA.
	if got, want := issuer(t, resp), r.pki.root.Subject.CommonName; got != want {
		t.Errorf("the guest saw a certificate issued by %q, want the server's own (%q): the tunnel was intercepted", got, want)
	}
}

func TestOnlyTheSecretsHeaderIsChanged(t *testing.T) {
	r := newRig(t)
	a, ph := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	addr, _ := r.serve(a)
	c := r.guest(addr)
	// The placeholder elsewhere than the secret's header goes as it is.
	resp, body := do(t, c, "POST", r.api.urlAt(apiHost, "/p?token="+ph), map[string]string{
		"Authorization": bearer(ph), "X-Other": ph}, "body "+ph)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	got := r.api.last(t)
	if a := got.Header.Get("Authorization"); a != "Bearer "+valueOf("a") {
		t.Errorf("Authorization %q, want the value", a)
	}
	if got.Header.Get("X-Other") != ph || got.Query != "token="+ph || got.Body != "body "+ph {
		t.Errorf("the placeholder outside the secret's header was changed: header %q, query %q, body %q",
			got.Header.Get("X-Other"), got.Query, got.Body)
	}
	// A header without the placeholder is passed unchanged.
	do(t, c, "GET", r.api.urlAt(apiHost, "/"), map[string]string{"Authorization": "Bearer mine"}, "")
	if a := r.api.last(t).Header.Get("Authorization"); a != "Bearer mine" {
		t.Errorf("Authorization without the placeholder arrived as %q, want it unchanged", a)
	}
	// No header at all: none is added.
	do(t, c, "GET", r.api.urlAt(apiHost, "/"), nil, "")
	if a, ok := r.api.last(t).Header["Authorization"]; ok {
		t.Errorf("the broker added Authorization %q to a request without one", a)
	}
}

func TestPlainHTTP(t *testing.T) {
	r := newRig(t)
	a, ph := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	addr, _ := r.serve(a)
	c := r.guest(addr)
	resp, body := do(t, c, "GET", r.plain.urlAt(apiHost, "/"), map[string]string{"Authorization": bearer(ph)}, "")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got := r.plain.last(t).Header.Get("Authorization"); got != "Bearer "+valueOf("a") {
		t.Errorf("plain HTTP to the bound host: Authorization %q, want the value", got)
	}
	do(t, c, "GET", r.plain.urlAt(otherHost, "/"), map[string]string{"Authorization": bearer(ph)}, "")
	if got := r.plain.last(t).Header.Get("Authorization"); got != bearer(ph) {
		t.Errorf("plain HTTP to another host: Authorization %q, want the placeholder", got)
	}
}

func TestUpstreamCertificateIsVerified(t *testing.T) {
	r := newRig(t)
	r.opts.ExtraRoots = nil // the host does not trust the test servers' CA
	a, ph := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	addr, _ := r.serve(a)
	resp, body := do(t, r.guest(addr), "GET", r.api.urlAt(apiHost, "/"), map[string]string{"Authorization": bearer(ph)}, "")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "certificate") {
		t.Errorf("a bound host whose certificate does not verify: %d %q, want 502 about its certificate", resp.StatusCode, body)
	}
	if n := r.api.count(); n != 0 {
		t.Errorf("the server got %d requests, want none", n)
	}
}

func TestLostValueIsRefusedNamingTheSecret(t *testing.T) {
	r := newRig(t)
	a, ph := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	a.Secrets[0].Secret.ValueFrom = contract.ValueFrom{Env: "API_TOKEN"}
	a.Secrets[0].Value = nil // as a restarted broker has it
	addr, _ := r.serve(a)
	resp, body := do(t, r.guest(addr), "GET", r.api.urlAt(apiHost, "/"), map[string]string{"Authorization": bearer(ph)}, "")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "secret TOKEN") || !strings.Contains(body, "value_from.env") {
		t.Errorf("got %d %q, want 503 naming secret TOKEN and its source", resp.StatusCode, body)
	}
	if n := r.api.count(); n != 0 {
		t.Errorf("the server got %d requests, want none", n)
	}
}

func TestEgressOfTheProxy(t *testing.T) {
	r := newRig(t)
	a, ph := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	a.Egress = nil // all: out on a network, not the host's loopback
	addr, _ := r.serve(a)
	c := r.guest(addr)
	resp, body := do(t, c, "GET", r.plain.urlAt(apiHost, "/"), map[string]string{"Authorization": bearer(ph)}, "")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "may not reach") {
		t.Errorf("plain HTTP to the host's loopback: %d %q, want 403", resp.StatusCode, body)
	}
	resp, body = do(t, c, "GET", "http://169.254.169.254/latest/meta-data/", nil, "")
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("the metadata address: %d %q, want 403", resp.StatusCode, body)
	}
	// A tunnel is refused before it is made.
	if _, err := c.Get(r.other.urlAt(otherHost, "/")); err == nil {
		t.Error("a CONNECT to the host's loopback was let through")
	}
	if n := r.api.count() + r.other.count() + r.plain.count(); n != 0 {
		t.Errorf("the servers got %d requests, want none", n)
	}
}

func TestEgressAllows(t *testing.T) {
	dest := func(s string) contract.Dest {
		d, err := contract.ParseDest(s)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	allow := &contract.Egress{Mode: contract.EgressAllow, Allow: []contract.Dest{
		dest("api.example.com:443"), dest("10.0.0.0/8"), dest("169.254.169.254:80")}}
	none := &contract.Egress{Mode: contract.EgressNone}
	ip := netip.MustParseAddr
	for _, tc := range []struct {
		e    *contract.Egress
		name string
		ip   string
		port int
		want bool
	}{
		{nil, "", "93.184.216.34", 443, true},
		{nil, "", "127.0.0.1", 80, false},
		{nil, "", "::1", 80, false},
		{nil, "", "169.254.169.254", 80, false},
		{nil, "", "::ffff:127.0.0.1", 80, false},
		{none, "", "93.184.216.34", 443, false},
		{allow, "api.example.com", "93.184.216.34", 443, true},
		{allow, "api.example.com", "93.184.216.34", 80, false},
		{allow, "evil.example.com", "93.184.216.34", 443, false},
		{allow, "", "10.1.2.3", 22, true},
		{allow, "", "11.1.2.3", 22, false},
		{allow, "", "169.254.169.254", 80, true},
		{allow, "", "169.254.169.254", 81, false},
	} {
		if got := egressAllows(tc.e, tc.name, ip(tc.ip), tc.port); got != tc.want {
			t.Errorf("egress %v: %s %s:%d allowed %v, want %v", tc.e, tc.name, tc.ip, tc.port, got, tc.want)
		}
	}
}

// connectTLS opens a tunnel through the proxy at a to authority and
// starts TLS in it for serverName, as a guest's client does.
func connectTLS(t *testing.T, a Addr, authority, serverName string, roots ...*x509.Certificate) *tls.Conn {
	t.Helper()
	c, err := net.Dial(a.Network, a.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %v %v", authority, resp, err)
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	tc := tls.Client(c, &tls.Config{ServerName: serverName, RootCAs: pool})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	return tc
}

// rawRequest writes req on c and reads the response.
func rawRequest(t *testing.T, c net.Conn, req string) (*http.Response, string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestTerminatedConnectionServesItsHostOnly(t *testing.T) {
	r := newRig(t)
	a, ph := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	addr, _ := r.serve(a)
	authority := apiHost + ":" + strings.TrimPrefix(r.api.urlAt("", ""), "https://:")
	tc := connectTLS(t, addr, authority, apiHost, r.ca.Certificate())
	// A request for other.test inside the connection to api.test: the
	// value must not go there, and nor may the request.
	resp, body := rawRequest(t, tc, "GET / HTTP/1.1\r\nHost: "+otherHost+"\r\nAuthorization: "+bearer(ph)+"\r\n\r\n")
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("got %d %q, want 421", resp.StatusCode, body)
	}
	if n := r.api.count() + r.other.count(); n != 0 {
		t.Errorf("the servers got %d requests, want none", n)
	}
}

func TestTraceToABoundHostIsRefused(t *testing.T) {
	r := newRig(t)
	a, ph := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	addr, _ := r.serve(a)
	resp, body := do(t, r.guest(addr), "TRACE", r.api.urlAt(apiHost, "/"), map[string]string{"Authorization": bearer(ph)}, "")
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("TRACE: %d %q, want 405", resp.StatusCode, body)
	}
}

func TestLimits(t *testing.T) {
	r := newRig(t)
	r.opts.Limits = Limits{MaxConns: 1, MaxHeaderBytes: 1024}
	a, _ := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	addr, _ := r.serve(a)
	authority := apiHost + ":" + strings.TrimPrefix(r.api.urlAt("", ""), "https://:")
	tc := connectTLS(t, addr, authority, apiHost, r.ca.Certificate())

	// tc holds the one connection allowed: another is answered 503.
	c, err := net.Dial(addr.Network, addr.Address)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if resp, body := rawRequest(t, c, "CONNECT "+authority+" HTTP/1.1\r\nHost: "+authority+"\r\n\r\n"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a connection past the cap: %d %q, want 503", resp.StatusCode, body)
	}

	// A header past the limit, inside a terminated connection.
	resp, _ := rawRequest(t, tc, "GET / HTTP/1.1\r\nHost: "+apiHost+"\r\nX-Big: "+strings.Repeat("x", 64<<10)+"\r\n\r\n")
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 64 KiB header: %d, want 431", resp.StatusCode)
	}
	if n := r.api.count(); n != 0 {
		t.Errorf("the server got %d requests, want none", n)
	}
}

func TestBrokerDownRefuses(t *testing.T) {
	r := newRig(t)
	a, _ := r.child("a", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	b, _ := r.child("b", Addr{Network: "unix", Address: sockPath(t, "b.sock")})
	addrA, pa := r.serve(a)
	addrB, pb := r.serve(b)
	// An open tunnel to other.test, through a's proxy.
	tunnel := connectTLS(t, addrA, otherHost+":"+strings.TrimPrefix(r.other.urlAt("", ""), "https://:"), otherHost, r.pki.root)

	pa.Close()
	pb.Close()
	for _, addr := range []Addr{addrA, addrB} {
		c, err := net.Dial(addr.Network, addr.Address)
		if err == nil {
			c.Close()
			t.Errorf("%s: a connection was accepted after the proxy closed", addr)
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want connection refused", addr, err)
		}
	}
	tunnel.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := tunnel.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a tunnel open when the proxy closed: read %v, want it closed", err)
	}
}

// A machine on QEMU's user network reaches its proxy through the host's
// loopback: only its own QEMU (process PID) is let in.
func TestFromPIDLetsInOnlyThatProcess(t *testing.T) {
	r := newRig(t)
	mine, ph := r.child("mine", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	mine.PID, mine.FromPID = os.Getpid(), true
	other, _ := r.child("other", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	other.PID, other.FromPID = os.Getppid(), true // not this process
	addrMine, _ := r.serve(mine)
	addrOther, _ := r.serve(other)
	resp, body := do(t, r.guest(addrMine), "GET", r.api.urlAt(apiHost, "/"), map[string]string{"Authorization": bearer(ph)}, "")
	if resp.StatusCode != 200 {
		t.Fatalf("from the machine's own process: status %d: %s", resp.StatusCode, body)
	}
	req, _ := http.NewRequestWithContext(t.Context(), "GET", r.api.urlAt(apiHost, "/"), nil)
	if resp, err := r.guest(addrOther).Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("from another process: status %d, want the connection closed unanswered", resp.StatusCode)
	}
}
