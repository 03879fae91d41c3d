package broker

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// childListener is a child's listener as its proxy serves it: it caps the
// child's open connections (one past the cap is answered 503 and closed,
// not queued), drops TCP connections from outside AllowFrom, and tracks
// every connection it gave out, hijacked ones (tunnels, TLS terminated by
// the broker) included, so closing the child closes them all.
type childListener struct {
	net.Listener
	max       int
	idle      time.Duration
	allowFrom func() []netip.Prefix // read per connection: Update may change it
	fromPID   func() (pid int, only bool)
	onDrop    func(reason string, remote net.Addr)

	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

func newChildListener(l net.Listener, lim Limits, allowFrom func() []netip.Prefix, fromPID func() (int, bool), onDrop func(string, net.Addr)) *childListener {
	return &childListener{Listener: l, max: lim.MaxConns, idle: lim.IdleTimeout, allowFrom: allowFrom,
		fromPID: fromPID, onDrop: onDrop, conns: map[*trackedConn]struct{}{}}
}

func (l *childListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if !l.fromAllowed(c) {
			l.onDrop("source address not the machine's", c.RemoteAddr())
			c.Close()
			continue
		}
		if pid, only := l.fromPID(); only {
			if ok, err := peerHeldBy(c, pid); !ok {
				reason := "not from the machine's own QEMU"
				if err != nil {
					reason += ": " + err.Error()
				}
				l.onDrop(reason, c.RemoteAddr())
				c.Close()
				continue
			}
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return nil, net.ErrClosed
		}
		if len(l.conns) >= l.max {
			l.mu.Unlock()
			l.onDrop("too many connections", c.RemoteAddr())
			go refuse(c, "503 Service Unavailable", "vmfork broker: too many connections from this machine\n")
			continue
		}
		tc := &trackedConn{Conn: c, l: l}
		l.conns[tc] = struct{}{}
		l.mu.Unlock()
		tc.watchIdle(l.idle)
		return tc, nil
	}
}

func (l *childListener) fromAllowed(c net.Conn) bool {
	allow := l.allowFrom()
	if len(allow) == 0 {
		return true
	}
	ta, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return false
	}
	ip := ta.AddrPort().Addr().Unmap()
	for _, p := range allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Close closes the listener and every connection it gave out.
func (l *childListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closed = true
	conns := make([]*trackedConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return err
}

// refuse answers a connection the broker will not serve with a bare HTTP
// response and closes it; the write is bounded, so a guest that does not
// read cannot hold it.
func refuse(c net.Conn, status, body string) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	io.WriteString(c, "HTTP/1.1 "+status+"\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"+body)
	c.Close()
}

// trackedConn is a connection of a childListener. It closes itself after
// idle time without a byte either way, tunnels included: http.Server's
// timeouts end at a hijack, and a tunnel to a host is a hijacked
// connection. It keeps CloseRead and CloseWrite, which goproxy's tunnel
// uses to pass on a half close.
type trackedConn struct {
	net.Conn
	l        *childListener
	last     atomic.Int64 // unix nanoseconds of the last read or write
	timer    atomic.Pointer[time.Timer]
	closed   atomic.Bool
	closeOne sync.Once
	err      error
}

func (c *trackedConn) watchIdle(idle time.Duration) {
	c.last.Store(time.Now().UnixNano())
	var check func()
	check = func() {
		if c.closed.Load() {
			return
		}
		left := idle - time.Since(time.Unix(0, c.last.Load()))
		if left > 0 {
			c.timer.Store(time.AfterFunc(left, check))
			return
		}
		c.Close()
	}
	c.timer.Store(time.AfterFunc(idle, check))
}

func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.last.Store(time.Now().UnixNano())
	return n, err
}

func (c *trackedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.last.Store(time.Now().UnixNano())
	return n, err
}

func (c *trackedConn) Close() error {
	c.closeOne.Do(func() {
		c.closed.Store(true)
		if t := c.timer.Load(); t != nil {
			t.Stop()
		}
		c.err = c.Conn.Close()
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.err
}

func (c *trackedConn) CloseRead() error {
	if hc, ok := c.Conn.(interface{ CloseRead() error }); ok {
		return hc.CloseRead()
	}
	return errors.ErrUnsupported
}

func (c *trackedConn) CloseWrite() error {
	if hc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return hc.CloseWrite()
	}
	return errors.ErrUnsupported
}

// chanListener hands the connections the broker terminated TLS on (to a
// bound host) to the child's http.Server, which serves them as it serves
// the child's proxy connections: same limits, same timeouts.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// push hands c to the server; false when the listener is closed.
func (l *chanListener) push(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }
