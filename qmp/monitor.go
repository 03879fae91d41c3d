package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Greeting is what QEMU announces when a client connects.
type Greeting struct {
	Version      goqmp.Version `json:"version"`
	Capabilities []string      `json:"capabilities"` // QEMU 7.2 offers ["oob"]; this client enables none
}

// Monitor is a QMP client on one connection to QEMU. Its methods are safe for concurrent use. See
// the package documentation for the reader, id and cancel model.
type Monitor struct {
	conn        net.Conn
	log         *logrus.Entry
	greeting    Greeting
	callTimeout time.Duration // see WithCallTimeout

	nextID atomic.Uint64
	wsem   chan struct{} // held while writing one command; a channel so waiting honours ctx
	fdsem  chan struct{} // held for a whole fd-carrying round trip, see ExecuteWithFile

	mu      sync.Mutex
	pending map[string]chan message // by id; each channel has room for its one reply
	subs    map[*subscriber]struct{}
	err     error // why the connection ended; set before done is closed

	greeted   chan Greeting
	done      chan struct{} // closed by the reader when the connection ends
	closing   atomic.Bool
	closeOnce sync.Once
}

// message is any JSON object QEMU sends: the greeting, an event or a reply.
type message struct {
	QMP       *Greeting       `json:"QMP"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *timestamp      `json:"timestamp"`
	ID        json.RawMessage `json:"id"`
	Return    json.RawMessage `json:"return"`
	Error     *errorBody      `json:"error"`

	raw json.RawMessage // the whole object, for the debug log of a dropped reply
}

// request is a command on the wire. It reuses go-qemu's Command and adds the id QEMU echoes.
type request struct {
	goqmp.Command
	ID string `json:"id"`
}

// Dial connects to the QMP socket at path, reads QEMU's greeting and ends capability negotiation
// with qmp_capabilities, all bounded by ctx. It tries once: while QEMU is still starting the socket
// may not exist yet, and the caller decides how long to retry.
func Dial(ctx context.Context, path string, opts ...Option) (*Monitor, error) {
	o := buildOptions(opts)
	ctx, cancel := bound(ctx, o.callTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial %s: %w", path, err)
	}
	m := &Monitor{
		conn:        c,
		callTimeout: o.callTimeout,
		log:         o.log.WithField("qmp_socket", path),
		wsem:        make(chan struct{}, 1),
		fdsem:       make(chan struct{}, 1),
		pending:     make(map[string]chan message),
		subs:        make(map[*subscriber]struct{}),
		greeted:     make(chan Greeting, 1),
		done:        make(chan struct{}),
	}
	go m.read()

	select {
	case m.greeting = <-m.greeted:
	case <-m.done:
		return nil, fmt.Errorf("qmp: dial %s: read greeting: %w", path, m.Err())
	case <-ctx.Done():
		m.Close()
		return nil, fmt.Errorf("qmp: dial %s: read greeting: %w", path, ctx.Err())
	}
	// No capabilities are enabled: "oob" would let QEMU read the next command while one is still
	// running, which breaks the one-fd-per-getfd pairing ExecuteWithFile relies on.
	if err := m.Execute(ctx, CmdQMPCapabilities, nil, nil); err != nil {
		m.Close()
		return nil, fmt.Errorf("qmp: dial %s: %w", path, err)
	}
	return m, nil
}

// Greeting returns what QEMU announced on connect, such as its version.
func (m *Monitor) Greeting() Greeting { return m.greeting }

// Done returns a channel that is closed when the connection has ended, because QEMU exited, the
// socket failed or Close was called. Waiters select on it to notice QEMU's death.
func (m *Monitor) Done() <-chan struct{} { return m.done }

// Err returns why the connection ended, wrapping ErrClosed, or nil while it is open.
func (m *Monitor) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Close closes the connection and waits for the reader to stop. Pending calls fail with ErrClosed.
// It is idempotent and always returns nil; it exists to satisfy io.Closer.
func (m *Monitor) Close() error {
	m.closeOnce.Do(func() {
		m.closing.Store(true)
		m.conn.Close()
	})
	<-m.done
	return nil
}

// Execute runs cmd with args and decodes the reply's "return" into result. A nil args sends no
// "arguments"; a nil result ignores the return value. An error reply is an *Error; a connection
// that ends first gives an error wrapping ErrClosed; a ctx that ends first gives ctx.Err() wrapped,
// and QEMU may still run the command (see the package documentation).
func (m *Monitor) Execute(ctx context.Context, cmd string, args, result any) error {
	return m.execute(ctx, cmd, args, nil, result)
}

// ExecuteWithFile is Execute that also passes f's descriptor to QEMU with SCM_RIGHTS on the same
// write as the command, which is how getfd and add-fd receive a descriptor. QEMU dups it, so the
// caller may close f when the call returns. Only one fd-carrying command is in flight at a time:
// QEMU keeps just the last descriptor it received for the next command that asks for one.
func (m *Monitor) ExecuteWithFile(ctx context.Context, cmd string, args any, f *os.File, result any) error {
	if f == nil {
		return fmt.Errorf("qmp: %s: no file to pass", cmd)
	}
	if _, ok := m.conn.(*net.UnixConn); !ok {
		return fmt.Errorf("qmp: %s: passing a file needs a unix socket", cmd)
	}
	select {
	case m.fdsem <- struct{}{}:
		defer func() { <-m.fdsem }()
	case <-ctx.Done():
		return fmt.Errorf("qmp: %s: %w", cmd, ctx.Err())
	}
	return m.execute(ctx, cmd, args, f, result)
}

func (m *Monitor) execute(ctx context.Context, cmd string, args any, f *os.File, result any) error {
	ctx, cancel := bound(ctx, m.callTimeout)
	defer cancel()
	id := "vmfork-" + strconv.FormatUint(m.nextID.Add(1), 10)
	req, err := json.Marshal(request{Command: goqmp.Command{Execute: cmd, Args: omitNil(args)}, ID: id})
	if err != nil {
		return fmt.Errorf("qmp: %s: encode arguments: %w", cmd, err)
	}
	reply, err := m.roundTrip(ctx, cmd, id, req, f)
	if err != nil {
		return err
	}
	return decodeReply(cmd, reply.Return, reply.Error, result)
}

// roundTrip sends req, which must carry id, and waits for the reply with that id.
func (m *Monitor) roundTrip(ctx context.Context, cmd, id string, req []byte, f *os.File) (message, error) {
	ch := make(chan message, 1)
	m.mu.Lock()
	if m.err != nil {
		err := m.err
		m.mu.Unlock()
		return message{}, fmt.Errorf("qmp: %s: %w", cmd, err)
	}
	m.pending[id] = ch
	m.mu.Unlock()
	abandon := func() {
		m.mu.Lock()
		delete(m.pending, id)
		m.mu.Unlock()
	}

	m.log.WithFields(logrus.Fields{"qmp_cmd": cmd, "qmp_id": id}).Debug("qmp command")
	if err := m.write(ctx, req, f); err != nil {
		abandon()
		return message{}, fmt.Errorf("qmp: %s: %w", cmd, err)
	}
	select {
	case r := <-ch:
		return r, nil
	case <-m.done:
		select { // the reply may have arrived just before the connection ended
		case r := <-ch:
			return r, nil
		default:
		}
		abandon()
		return message{}, fmt.Errorf("qmp: %s: %w", cmd, m.Err())
	case <-ctx.Done():
		// Forgetting the id makes the reader drop the late reply instead of handing it to the
		// next caller.
		abandon()
		return message{}, fmt.Errorf("qmp: %s: %w", cmd, ctx.Err())
	}
}

// write sends one command line, with f's descriptor attached when f is not nil.
func (m *Monitor) write(ctx context.Context, req []byte, f *os.File) error {
	select {
	case m.wsem <- struct{}{}:
		defer func() { <-m.wsem }()
	case <-ctx.Done():
		return ctx.Err()
	case <-m.done:
		return m.Err()
	}
	line := append(req, '\n')
	var n int
	err := withDeadline(ctx, m.conn.SetWriteDeadline, func() error {
		var err error
		if f == nil {
			n, err = m.conn.Write(line)
		} else {
			n, err = writeWithFile(m.conn.(*net.UnixConn), line, f)
		}
		return err
	})
	if err != nil && n > 0 {
		// Part of the line went out; QEMU would read it as the start of the next command, so
		// the connection is unusable. With nothing written the stream is still intact.
		m.conn.Close()
	}
	return err
}

// writeWithFile writes line with f's descriptor as SCM_RIGHTS ancillary data on its first byte
// and returns how much of line it wrote.
func writeWithFile(c *net.UnixConn, line []byte, f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var werr error
	// Control keeps the descriptor open and valid while it is sent, unlike f.Fd().
	if err := rc.Control(func(fd uintptr) {
		n, _, werr = c.WriteMsgUnix(line, unix.UnixRights(int(fd)), nil)
	}); err != nil {
		return 0, err
	}
	if werr == nil && n < len(line) {
		var m int
		m, werr = c.Write(line[n:])
		n += m
	}
	return n, werr
}

// read is the reader goroutine. It owns the read side of the connection until it fails.
func (m *Monitor) read() {
	// json.Decoder has no line limit, unlike the bufio.Scanner in go-qemu, and also accepts QEMU's
	// pretty=on output.
	dec := json.NewDecoder(m.conn)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			m.shutdown(err)
			return
		}
		var msg message
		if err := json.Unmarshal(raw, &msg); err != nil {
			m.log.WithError(err).Debug("qmp: ignoring a message that is not an object")
			continue
		}
		msg.raw = raw
		switch {
		case msg.QMP != nil:
			select {
			case m.greeted <- *msg.QMP:
			default: // a second greeting is nonsense; Dial has the first
			}
		case msg.Event != "":
			m.publish(newEvent(msg))
		default:
			m.deliver(msg)
		}
	}
}

// deliver hands a reply to the caller waiting for its id. Replies to cancelled commands are dropped.
func (m *Monitor) deliver(msg message) {
	var id string
	if err := json.Unmarshal(msg.ID, &id); err != nil || id == "" {
		// QEMU omits the id only when it could not parse the command, which this client never sends.
		m.log.WithField("reply", truncate(msg.raw)).Debug("qmp: dropping a reply without id")
		return
	}
	m.mu.Lock()
	ch, ok := m.pending[id]
	delete(m.pending, id)
	m.mu.Unlock()
	if !ok {
		m.log.WithField("qmp_id", id).Debug("qmp: dropping the late reply of an abandoned command")
		return
	}
	ch <- msg // buffered for exactly this reply
}

// shutdown records why the connection ended and wakes every waiter through done.
func (m *Monitor) shutdown(cause error) {
	err := fmt.Errorf("%w: %w", ErrClosed, cause)
	if m.closing.Load() || errors.Is(cause, net.ErrClosed) {
		err = ErrClosed
	}
	m.mu.Lock()
	m.err = err
	m.mu.Unlock()
	m.conn.Close()
	close(m.done)
}

// omitNil turns a typed nil (a nil map or pointer) into an untyped one, so that "arguments" is
// left out: QEMU rejects "arguments": null.
func omitNil(args any) any {
	v := reflect.ValueOf(args)
	switch v.Kind() {
	case reflect.Map, reflect.Pointer, reflect.Slice, reflect.Interface:
		if v.IsNil() {
			return nil
		}
	}
	return args
}

func truncate(b []byte) string {
	const max = 200
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}
