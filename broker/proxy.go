package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/sirupsen/logrus"
)

// Limits bound what one child's proxy may hold. The zero value of a field
// takes its default.
type Limits struct {
	// MaxConns caps the child's open connections to its proxy (tunnels
	// included); one more is answered 503 and closed. Default 64.
	MaxConns int
	// MaxHeaderBytes bounds a request's header, on the proxy's own
	// connections and on those it terminates TLS on. Default 64 KiB.
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds the wait for a request's header (and a
	// guest's TLS handshake with the broker). Default 30s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a connection, tunnel or not, with no byte either
	// way for this long. Default 10m.
	IdleTimeout time.Duration
	// DialTimeout bounds a connection to a server. Default 30s.
	DialTimeout time.Duration
	// TLSHandshakeTimeout bounds the broker's handshake with a bound
	// host's server. Default 15s.
	TLSHandshakeTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for a bound host's response
	// header once the request is sent. Default 5m (slow APIs stream).
	ResponseHeaderTimeout time.Duration
}

func (l Limits) withDefaults() Limits {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if l.MaxConns <= 0 {
		l.MaxConns = 64
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = 64 << 10
	}
	def(&l.ReadHeaderTimeout, 30*time.Second)
	def(&l.IdleTimeout, 10*time.Minute)
	def(&l.DialTimeout, 30*time.Second)
	def(&l.TLSHandshakeTimeout, 15*time.Second)
	def(&l.ResponseHeaderTimeout, 5*time.Minute)
	return l
}

// Options are what every child's proxy of a broker shares.
type Options struct {
	// ExtraRoots are trusted for servers besides the host's trust store
	// (a test server's CA).
	ExtraRoots []*x509.Certificate
	// Limits bound each child's proxy.
	Limits Limits
	// LookupNetIP resolves host names (nil: the host's resolver). Tests
	// point names at their servers with it.
	LookupNetIP func(ctx context.Context, host string) ([]netip.Addr, error)
	// Log receives the proxy's events (nil: none). Values are never
	// logged; secrets by name only.
	Log *logrus.Entry
}

// Proxy is one child's HTTP proxy (what the guest's HTTPS_PROXY and
// HTTP_PROXY name). Every connection it accepts is taken to come from
// that child. A CONNECT to a host one of its secrets is bound to is
// terminated with a certificate vmfork's CA signs, and each request in it
// gets the secret's value in place of the placeholder; a CONNECT to any
// other host is a plain tunnel the broker never decrypts. Plain HTTP
// requests get the same treatment by host.
type Proxy struct {
	name string
	ca   *CA
	opts Options
	log  *logrus.Entry
	cfg  atomic.Pointer[childConfig]
	gp   *goproxy.ProxyHttpServer
	tr   *http.Transport
	srv  *http.Server
	mitm *chanListener

	mu     sync.Mutex
	lns    []*childListener
	closed bool
}

// childConfig is what a child's proxy serves; Update swaps it whole.
type childConfig struct {
	child  Child
	byHost map[string][]Binding
}

func newChildConfig(c Child) *childConfig {
	cfg := &childConfig{child: c, byHost: map[string][]Binding{}}
	for _, b := range c.Secrets {
		for _, h := range b.Secret.Hosts {
			h = normHost(h)
			cfg.byHost[h] = append(cfg.byHost[h], b)
		}
	}
	return cfg
}

// mitmKey marks, in a request's context, a connection the broker
// terminated TLS on; its value is the CONNECT's HOST:PORT.
type mitmKey struct{}

// mitmConn is a guest's connection, after CONNECT, that the broker
// terminates TLS on.
type mitmConn struct {
	net.Conn
	authority string
}

// NewProxy makes child's proxy; Serve starts it on a listener. A secret
// without a value (nil Value) is served as lost: a request that carries
// its placeholder to a bound host is answered 503.
func NewProxy(ca *CA, child Child, opts Options) (*Proxy, error) {
	child = child.clone(true)
	if err := child.validate(); err != nil {
		return nil, err
	}
	opts.Limits = opts.Limits.withDefaults()
	if opts.Log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		opts.Log = logrus.NewEntry(l)
	}
	p := &Proxy{name: child.Name, ca: ca, opts: opts, log: opts.Log.WithField("machine", child.Name)}
	p.cfg.Store(newChildConfig(child))

	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	for _, c := range opts.ExtraRoots {
		roots.AddCert(c)
	}
	lim := opts.Limits
	p.tr = &http.Transport{
		// No Proxy: the host's proxy settings are not the guest's.
		DialContext:            p.dial,
		TLSClientConfig:        &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:      true,
		TLSHandshakeTimeout:    lim.TLSHandshakeTimeout,
		ResponseHeaderTimeout:  lim.ResponseHeaderTimeout,
		MaxResponseHeaderBytes: 1 << 20,
		IdleConnTimeout:        90 * time.Second,
		MaxConnsPerHost:        lim.MaxConns,
		// The guest asked for the encoding it wants; pass it through.
		DisableCompression: true,
	}

	gp := goproxy.NewProxyHttpServer()
	gp.Logger = debugLogger{p.log}
	// goproxy's defaults skip TLS verification and follow the host's
	// HTTPS_PROXY; both are replaced here.
	gp.Tr = p.tr
	gp.ConnectDial = nil
	gp.ConnectDialWithReq = func(req *http.Request, network, addr string) (net.Conn, error) {
		return p.dial(req.Context(), network, addr)
	}
	gp.CertStore = ca.certs
	gp.KeepAcceptEncoding = true
	gp.NonproxyHandler = http.HandlerFunc(notProxy)
	gp.OnRequest().HandleConnectFunc(p.handleConnect)
	gp.OnRequest().DoFunc(p.substitute)
	gp.OnResponse().DoFunc(upstreamError)
	p.gp = gp

	p.mitm = newChanListener(&net.UnixAddr{Name: "vmfork-broker-tls", Net: "unix"})
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ConnContext:       mitmContext,
		ErrorLog:          log.New(logWriter{p.log}, "", 0),
		// HTTP/1.1 only towards the guest, on terminated TLS too.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	go p.srv.Serve(p.mitm)
	return p, nil
}

// Serve serves the child's proxy on l until Close, and closes l. It may
// be called for more than one listener.
func (p *Proxy) Serve(l net.Listener) error {
	cl := newChildListener(l, p.opts.Limits, p.allowFrom, p.fromPID, func(reason string, from net.Addr) {
		p.log.WithFields(logrus.Fields{"from": from.String(), "reason": reason}).Warn("connection to a machine's proxy dropped")
	})
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.Close()
		return nil
	}
	p.lns = append(p.lns, cl)
	p.mu.Unlock()
	if err := p.srv.Serve(cl); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("broker: machine %q: %w", p.name, err)
	}
	return nil
}

func (p *Proxy) allowFrom() []netip.Prefix { return p.cfg.Load().child.AllowFrom }

func (p *Proxy) fromPID() (int, bool) {
	c := p.cfg.Load().child
	return c.PID, c.FromPID
}

// Update replaces the child's secrets, values, egress and AllowFrom
// (a re-registration); its listeners stay. Requests already sent keep
// what they had.
func (p *Proxy) Update(child Child) error {
	child = child.clone(true)
	if err := child.validate(); err != nil {
		return err
	}
	if child.Name != p.name {
		return fmt.Errorf("broker: update of machine %q with %q", p.name, child.Name)
	}
	p.cfg.Store(newChildConfig(child))
	return nil
}

// Close stops the proxy: its listeners and every connection to it,
// tunnels and terminated TLS included, are closed. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	lns := p.lns
	p.lns = nil
	p.mu.Unlock()
	p.mitm.Close()
	p.srv.Close()
	for _, l := range lns {
		l.Close()
	}
	p.tr.CloseIdleConnections()
	return nil
}

// ServeHTTP is the child's proxy, on its own connections and on those the
// broker terminated TLS on (where requests come in origin form and are
// sent to the CONNECT's host and port, and only there).
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if authority, ok := r.Context().Value(mitmKey{}).(string); ok {
		switch {
		case r.Method == http.MethodConnect:
			refuseRequest(w, http.StatusMethodNotAllowed, "CONNECT inside a tunnel")
			return
		case hostOfAuthority(r.Host) != hostOfAuthority(authority):
			// The Host of a terminated connection is the CONNECT's: a
			// request for another host must not ride it.
			refuseRequest(w, http.StatusMisdirectedRequest, fmt.Sprintf("this connection is for %s, not %s", hostOfAuthority(authority), r.Host))
			return
		}
		r.URL.Scheme, r.URL.Host = "https", authority
	}
	p.gp.ServeHTTP(w, r)
}

// handleConnect chooses, for a CONNECT, a plain tunnel (any host no
// secret of the child is bound to) or TLS termination by the broker.
func (p *Proxy) handleConnect(host string, _ *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	if len(p.cfg.Load().byHost[hostOfAuthority(host)]) == 0 {
		return &goproxy.ConnectAction{Action: goproxy.ConnectAccept}, host
	}
	return &goproxy.ConnectAction{Action: goproxy.ConnectHijack, Hijack: p.terminate}, host
}

// terminate answers a CONNECT to a bound host and hands the connection,
// TLS terminated with a certificate for that host signed by vmfork's CA,
// to the child's http.Server. Bytes a client sent after its CONNECT and
// before the 200 would be lost here; clients (curl, Go, Python, Node)
// wait for the 200.
func (p *Proxy) terminate(req *http.Request, client net.Conn, ctx *goproxy.ProxyCtx) {
	authority := req.URL.Host
	if _, _, err := net.SplitHostPort(authority); err != nil {
		authority = net.JoinHostPort(normHost(authority), "443")
	}
	conf, err := goproxy.TLSConfigFromCA(&p.ca.pair)(authority, ctx)
	if err != nil {
		p.log.WithError(err).Warn("no certificate for a bound host")
		refuse(client, "502 Bad Gateway", "vmfork broker: cannot sign a certificate for "+authority+"\n")
		return
	}
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		client.Close()
		return
	}
	conf.NextProtos = []string{"http/1.1"}
	conf.MinVersion = tls.VersionTLS12
	tc := tls.Server(&mitmConn{Conn: client, authority: authority}, conf)
	if !p.mitm.push(tc) {
		tc.Close()
	}
}

func mitmContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		if m, ok := tc.NetConn().(*mitmConn); ok {
			return context.WithValue(ctx, mitmKey{}, m.authority)
		}
	}
	return ctx
}

// substitute puts the child's value in place of its placeholder: only in
// a request to a host the secret is bound to, only in the secret's
// header, and only when that header holds the placeholder; the header
// becomes the secret's format with the value. Everything else in every
// request goes as the guest sent it.
func (p *Proxy) substitute(req *http.Request, _ *goproxy.ProxyCtx) (*http.Request, *http.Response) {
	host := normHost(req.URL.Hostname())
	binds := p.cfg.Load().byHost[host]
	if len(binds) == 0 {
		return req, nil
	}
	if req.Method == http.MethodTrace || req.Method == "TRACK" {
		// TRACE echoes the request, header and all, back to the guest.
		return req, proxyResponse(req, http.StatusMethodNotAllowed, req.Method+" to "+host+" would echo a brokered secret")
	}
	for _, b := range binds {
		if !holds(req.Header.Values(b.Secret.Header), b.Placeholder) {
			continue
		}
		log := p.log.WithFields(logrus.Fields{"secret": b.Name, "host": host})
		if b.Value == nil {
			log.Warn("request for a secret whose value is lost refused")
			return req, proxyResponse(req, http.StatusServiceUnavailable, lostValue(b))
		}
		req.Header.Set(b.Secret.Header, strings.ReplaceAll(b.Secret.Format, "{value}", string(b.Value)))
		log.Debug("secret added to a request")
	}
	return req, nil
}

// lostValue says why a secret has no value, and what restores it.
func lostValue(b Binding) string {
	why := "its value came from the environment (value_from.env) of the vmfork command that registered this machine"
	if b.source() != "env" {
		why = "value_from." + b.source() + " failed when the broker resolved it again (see the broker's log)"
	}
	return fmt.Sprintf("secret %s has no value since the broker restarted: %s; "+
		"registering the machine again (a vmfork command that touches it) restores it", b.Name, why)
}

func holds(values []string, placeholder string) bool {
	for _, v := range values {
		if strings.Contains(v, placeholder) {
			return true
		}
	}
	return false
}

// upstreamError answers a request the broker could not send (refused by
// the egress, no connection, a server certificate that does not verify):
// 403 or 502, saying why, instead of goproxy's bare 500.
func upstreamError(resp *http.Response, ctx *goproxy.ProxyCtx) *http.Response {
	if resp != nil || ctx.Error == nil {
		return resp
	}
	status := http.StatusBadGateway
	if errors.Is(ctx.Error, ErrDenied) {
		status = http.StatusForbidden
	}
	return proxyResponse(ctx.Req, status, ctx.Error.Error())
}

func proxyResponse(req *http.Request, status int, msg string) *http.Response {
	return goproxy.NewResponse(req, goproxy.ContentTypeText, status, "vmfork broker: "+msg+"\n")
}

func refuseRequest(w http.ResponseWriter, status int, msg string) {
	http.Error(w, "vmfork broker: "+msg, status)
}

func notProxy(w http.ResponseWriter, _ *http.Request) {
	refuseRequest(w, http.StatusBadRequest, "this is a proxy: send requests through it (HTTPS_PROXY, HTTP_PROXY)")
}

// debugLogger is goproxy's logger: its messages (connections, dial
// errors; never header values) at debug level.
type debugLogger struct{ e *logrus.Entry }

func (l debugLogger) Printf(format string, v ...any) {
	l.e.Debugf(strings.TrimSuffix(format, "\n"), v...)
}

// logWriter is http.Server's error log, at debug level (a guest that
// hangs up mid-request is not news).
type logWriter struct{ e *logrus.Entry }

func (l logWriter) Write(b []byte) (int, error) {
	l.e.Debug(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}
