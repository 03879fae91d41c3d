package mcpserver

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmfork/vmfork"
)

// MinTokenBytes is the shortest bearer token the HTTP transport takes: a
// short one could be guessed by anything that reaches the socket.
const MinTokenBytes = 16

// Listen opens addr for the streamable HTTP transport: "unix:PATH" (made
// mode 0600) or "HOST:PORT". Every HTTP request needs the operator's
// bearer token (Handler), wherever it comes from; IsLoopback tells the
// caller to warn about an address a network reaches.
func Listen(addr string) (net.Listener, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		if p == "" {
			return nil, fmt.Errorf("--listen unix: needs a path: %w", vmfork.ErrInvalid)
		}
		// A socket file left by a dead server would make Listen fail;
		// one a live server holds answers, and is not removed.
		if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("--listen %s: a server already answers there: %w", addr, vmfork.ErrExists)
		}
		os.Remove(p)
		l, err := net.Listen("unix", p)
		if err != nil {
			return nil, fmt.Errorf("--listen %s: %w", addr, err)
		}
		if err := os.Chmod(p, 0o600); err != nil {
			l.Close()
			return nil, fmt.Errorf("--listen %s: %w", addr, err)
		}
		return l, nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("--listen %q: want unix:PATH or HOST:PORT: %w", addr, vmfork.ErrInvalid)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", addr, err)
	}
	return l, nil
}

// IsLoopback reports whether listen address addr is a unix socket or a
// loopback one.
func IsLoopback(addr string) bool {
	if strings.HasPrefix(addr, "unix:") {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckToken checks a bearer token the operator set.
func CheckToken(token string) error {
	if len(token) < MinTokenBytes {
		return fmt.Errorf("the HTTP transport needs a bearer token of at least %d bytes (--token-file or VMFORK_MCP_TOKEN), got %d: %w", MinTokenBytes, len(token), vmfork.ErrInvalid)
	}
	if strings.ContainsAny(token, " \t\r\n") {
		return fmt.Errorf("the bearer token must not hold white space: %w", vmfork.ErrInvalid)
	}
	return nil
}

// Handler is the streamable HTTP transport of s behind a bearer token.
func (s *Server) Handler(token string) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.srv }, nil)
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="vmfork"`)
			http.Error(w, "vmfork mcp: missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// ServeHTTP serves s on l until ctx ends, then stops taking requests and
// waits for the calls in flight.
func (s *Server) ServeHTTP(ctx context.Context, l net.Listener, token string) error {
	if err := CheckToken(token); err != nil {
		return err
	}
	hs := &http.Server{Handler: s.Handler(token), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	select {
	case err := <-errc:
		s.calls.Wait()
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	hs.Shutdown(sctx)
	hs.Close()
	s.calls.Wait()
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
