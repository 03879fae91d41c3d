package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"

	"github.com/sirupsen/logrus"
)

// Transport carries guest-agent requests. Command sends one request, a JSON object without a
// trailing newline, and returns the agent's reply object; it must honour ctx and must never return
// a reply that belongs to another request. The socket transport from DialAgent is one; a libvirt
// driver can wrap virDomainQemuAgentCommand, which returns the same reply objects.
type Transport interface {
	Command(ctx context.Context, req []byte) ([]byte, error)
	Close() error
}

// agentConn is the Transport over the agent's chardev unix socket. It keeps one connection, which
// it dials and synchronizes lazily, and serializes commands: the protocol has no ids, so a reply
// belongs to a request only by its position in the stream.
type agentConn struct {
	path string
	log  *logrus.Entry
	sem  chan struct{} // held for a whole command; a channel so waiting honours ctx

	// Guarded by sem; conn is also guarded by mu, so that Close can interrupt a command.
	r      *bufio.Reader // reads conn
	synced bool          // false until a sync succeeds, and after a command was cut short

	mu     sync.Mutex
	conn   net.Conn // nil until dialled, and after an I/O error
	closed bool
}

var _ Transport = (*agentConn)(nil)

// DialAgent connects to the guest agent's chardev socket at path and synchronizes with the agent,
// bounded by ctx. It fails if no agent answers in time: QEMU accepts the connection even while the
// guest has no agent running, and the sync request then waits in the socket until one starts.
func DialAgent(ctx context.Context, path string, opts ...Option) (*Agent, error) {
	o := buildOptions(opts)
	ctx, cancel := bound(ctx, o.callTimeout)
	defer cancel()
	c := &agentConn{
		path: path,
		log:  o.log.WithField("qga_socket", path),
		sem:  make(chan struct{}, 1),
	}
	c.sem <- struct{}{}
	err := c.ensure(ctx)
	<-c.sem
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("qmp: dial agent %s: %w", path, err)
	}
	return NewAgent(c, opts...), nil
}

func (c *agentConn) Command(ctx context.Context, req []byte) ([]byte, error) {
	select {
	case c.sem <- struct{}{}:
		defer func() { <-c.sem }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := c.ensure(ctx); err != nil {
		return nil, err
	}
	line := make([]byte, 0, len(req)+1)
	line = append(append(line, req...), '\n')
	var reply []byte
	err := withDeadline(ctx, c.conn.SetDeadline, func() error {
		if _, err := c.conn.Write(line); err != nil {
			return err
		}
		var err error
		reply, err = c.readLine()
		return err
	})
	if err != nil {
		return nil, c.fail(ctx, err)
	}
	return reply, nil
}

// ensure leaves c with a synchronized connection, dialling if needed. A connection found broken
// while synchronizing is redialled once, since nothing was sent on it that could have run.
func (c *agentConn) ensure(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		closed, fresh := c.closed, c.conn == nil
		c.mu.Unlock()
		if closed {
			return ErrClosed
		}
		if fresh {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "unix", c.path)
			if err != nil {
				return err
			}
			c.mu.Lock()
			if c.closed {
				c.mu.Unlock()
				conn.Close()
				return ErrClosed
			}
			c.conn = conn
			c.mu.Unlock()
			c.r, c.synced = bufio.NewReader(conn), false
		}
		if c.synced {
			return nil
		}
		err := withDeadline(ctx, c.conn.SetDeadline, c.sync)
		if err == nil {
			c.synced = true
			return nil
		}
		err = c.fail(ctx, err)
		if ctx.Err() != nil || fresh || attempt > 0 {
			return err
		}
	}
}

// sync implements the handshake of reference §11.3. 0xFF makes qemu-ga drop any half-read request
// (a forked guest's agent may hold one), and the random id tells our sync reply apart from replies
// to requests whose callers gave up, which are still in the stream.
func (c *agentConn) sync() error {
	id := int64(rand.Uint32())
	req := fmt.Appendf([]byte{0xFF}, `{"execute":"guest-sync-delimited","arguments":{"id":%d}}`+"\n", id)
	if _, err := c.conn.Write(req); err != nil {
		return err
	}
	for {
		line, err := c.readLine()
		if err != nil {
			return err
		}
		var r struct {
			Return *int64 `json:"return"`
		}
		if json.Unmarshal(line, &r) == nil && r.Return != nil && *r.Return == id {
			return nil
		}
		c.log.WithField("output", truncate(line)).Debug("qga: discarding stale output before sync reply")
	}
}

// readLine returns the next non-empty reply line. qemu-ga writes 0xFF before the reply to
// guest-sync-delimited; 0xFF never occurs in valid UTF-8 and so never inside JSON, which makes
// dropping every 0xFF byte safe. bufio.Reader has no line-length limit.
func (c *agentConn) readLine() ([]byte, error) {
	for {
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		line = bytes.TrimSpace(bytes.ReplaceAll(line, []byte{0xFF}, nil))
		if len(line) > 0 {
			return line, nil
		}
	}
}

// fail decides what a failed exchange leaves behind and returns the error to report. When ctx cut
// it short the connection is still fine, but a reply may still arrive, so the next command must
// synchronize first. Any other error is a broken connection: close it, and the next command redials.
func (c *agentConn) fail(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		c.synced = false
		return err
	}
	c.mu.Lock()
	c.conn.Close()
	c.conn = nil
	c.mu.Unlock()
	c.r, c.synced = nil, false
	if errors.Is(err, ErrClosed) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrClosed, err)
}

// Close closes the connection; a command in progress fails with ErrClosed. It is idempotent, and
// commands after it fail with ErrClosed.
func (c *agentConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.conn != nil {
		return c.conn.Close()
	}
	return nil
}
