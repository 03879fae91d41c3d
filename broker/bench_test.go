package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// The proxy's cost, against the same requests sent straight to the
// server: a request to a bound host through a machine's proxy (TLS to the
// proxy, its certificate for the host, the header put in, TLS again to the
// server), one to an unbound host (a plain tunnel), and one sent direct.
// Each on a new connection (a curl per request, as an agent's commands
// send them) and on a kept-alive one (a program's client).
//
//	go test -run '^$' -bench Proxy -benchtime 300x ./broker
func BenchmarkProxy(b *testing.B) {
	r := newRig(b)
	c, ph := r.child("bench", Addr{Network: "tcp", Address: "127.0.0.1:0"})
	addr, _ := r.serve(c)
	pool := x509.NewCertPool()
	pool.AddCert(r.pki.root)
	pool.AddCert(r.ca.Certificate())
	client := func(viaProxy, keepAlive bool) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: !keepAlive}
		if viaProxy {
			tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy.guest:3128"})
			tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, addr.Network, addr.Address)
			}
		} else {
			server, _ := url.Parse(r.api.URL)
			tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", server.Host)
			}
		}
		return &http.Client{Transport: tr, Timeout: 20 * time.Second}
	}
	get := func(b *testing.B, cl *http.Client, u, header string) {
		req, _ := http.NewRequestWithContext(b.Context(), "GET", u, nil)
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		resp, err := cl.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	for _, keep := range []bool{false, true} {
		conn := "new-conn"
		if keep {
			conn = "keep-alive"
		}
		for _, c := range []struct {
			name   string
			proxy  bool
			url    string
			header string
		}{
			{"bound-host", true, r.api.urlAt(apiHost, "/"), bearer(ph)},
			{"unbound-host", true, r.other.urlAt(otherHost, "/"), ""},
			{"direct", false, r.api.urlAt(apiHost, "/"), ""},
		} {
			b.Run(conn+"/"+c.name, func(b *testing.B) {
				cl := client(c.proxy, keep)
				get(b, cl, c.url, c.header) // the proxy's certificate for the host, made once
				start := time.Now()
				for b.Loop() {
					get(b, cl, c.url, c.header)
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
			})
		}
	}
}
