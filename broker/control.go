package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/contract"
)

// The control protocol: on the control socket, one JSON request, one
// JSON response, per connection.
const (
	opPing       = "ping"
	opRegister   = "register"
	opUnregister = "unregister"
	opList       = "list"
)

type request struct {
	Op    string `json:"op"`
	Child *Child `json:"child,omitempty"`
	Name  string `json:"name,omitempty"`
}

type response struct {
	Error string `json:"error,omitempty"`
	// Kind names the sentinel Error wraps, so errors.Is works across the
	// socket: exiting, invalid, no_value.
	Kind     string   `json:"kind,omitempty"`
	Listen   *Addr    `json:"listen,omitempty"`
	Children []Status `json:"children,omitempty"`
}

var errorKinds = []struct {
	kind string
	err  error
}{
	{"exiting", ErrExiting},
	{"invalid", contract.ErrInvalid},
	{"no_value", ErrNoValue},
}

func errorResponse(err error) response {
	r := response{Error: err.Error()}
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			r.Kind = k.kind
			break
		}
	}
	return r
}

// remoteError is an error the broker answered.
type remoteError struct {
	msg string
	err error // the sentinel it wraps, or nil
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.err }

// handle answers one control connection: one request, one response.
func (s *Server) handle(ctx context.Context, c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(controlTimeout))
	enc := json.NewEncoder(c)
	if err := peerAllowed(c); err != nil {
		s.log.WithError(err).Warn("control connection refused")
		enc.Encode(response{Error: err.Error()})
		return
	}
	var req request
	if err := json.NewDecoder(io.LimitReader(c, maxControlBytes)).Decode(&req); err != nil {
		enc.Encode(errorResponse(fmt.Errorf("broker: bad request: %w: %w", err, contract.ErrInvalid)))
		return
	}
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	var resp response
	switch req.Op {
	case opPing:
	case opRegister:
		if req.Child == nil {
			resp = errorResponse(fmt.Errorf("broker: register without a machine: %w", contract.ErrInvalid))
			break
		}
		addr, err := s.Register(ctx, *req.Child)
		if err != nil {
			resp = errorResponse(err)
		} else {
			resp.Listen = &addr
		}
	case opUnregister:
		s.Unregister(req.Name)
	case opList:
		resp.Children = s.List()
	default:
		resp = errorResponse(fmt.Errorf("broker: unknown request %q: %w", req.Op, contract.ErrInvalid))
	}
	enc.Encode(resp)
}

// peerAllowed accepts a control connection from the broker's own user or
// root only (the socket is 0600 already; this holds should its directory
// be opened up).
func peerAllowed(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Getuid() {
		return fmt.Errorf("broker: control request from uid %d refused", cred.Uid)
	}
	return nil
}

// Starter starts a broker process for a directory (vmfork broker, in a
// session of its own so it outlives its caller). It must return without
// waiting for the broker.
type Starter func(ctx context.Context) error

// Client talks to the broker of a directory, starting one when it needs
// one and none runs.
type Client struct {
	// Dir is the broker's directory (Config.Dir).
	Dir string
	// Start starts a broker (nil: Register fails with ErrNotRunning when
	// none runs).
	Start Starter
	// Timeout bounds how long a call waits for a broker to answer,
	// starting one included (default 15s).
	Timeout time.Duration
}

// maxStarts bounds the brokers one call starts, should each die at once.
const maxStarts = 3

// pollEvery is how often a Client looks for a broker that is starting.
const pollEvery = 25 * time.Millisecond

func (c *Client) timeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return 15 * time.Second
}

// call sends one request to the running broker.
func (c *Client) call(ctx context.Context, req request) (response, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(c.Dir, SocketFile))
	if err != nil {
		return response{}, fmt.Errorf("%w: %w", ErrNotRunning, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return response{}, fmt.Errorf("%w: %w", ErrNotRunning, err)
	}
	var resp response
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		if ctx.Err() != nil {
			return response{}, fmt.Errorf("broker: %s: %w", req.Op, ctx.Err())
		}
		// The broker went away mid-request (it was exiting, or killed).
		return response{}, fmt.Errorf("%w: %s: %w", ErrNotRunning, req.Op, err)
	}
	if resp.Error != "" {
		re := &remoteError{msg: resp.Error}
		for _, k := range errorKinds {
			if resp.Kind == k.kind {
				re.err = k.err
			}
		}
		return resp, re
	}
	return resp, nil
}

// Ping reports whether a broker answers (ErrNotRunning if none does).
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.call(ctx, request{Op: opPing})
	return err
}

// Ensure returns once a broker answers, starting one if none runs: the
// first caller to find the lock free starts it, the others wait for it.
func (c *Client) Ensure(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	return c.ensure(ctx)
}

func (c *Client) ensure(ctx context.Context) error {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	starts := 0
	var last time.Time
	for {
		err := c.Ping(ctx)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrNotRunning) {
			return err
		}
		if c.Start == nil {
			return fmt.Errorf("broker in %s: %w", c.Dir, ErrNotRunning)
		}
		// A held lock is a broker starting (or exiting): wait for it.
		if starts < maxStarts && time.Since(last) > time.Second {
			unlock, free, err := tryLock(c.Dir)
			if err != nil {
				return err
			}
			if free {
				unlock()
				if err := c.Start(ctx); err != nil {
					return fmt.Errorf("broker: start: %w", err)
				}
				starts++
				last = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("broker in %s did not answer (its log: %s): %w", c.Dir, filepath.Join(c.Dir, LogFile), ctx.Err())
		case <-tick.C:
		}
	}
}

// Register registers child with the broker (Server.Register), starting a
// broker if none runs, and returns the address its proxy listens on. It
// is idempotent: registering a machine again replaces its registration,
// which is how a value lost in a broker's restart is restored.
func (c *Client) Register(ctx context.Context, child Child) (Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		if err := c.ensure(ctx); err != nil {
			return Addr{}, err
		}
		resp, err := c.call(ctx, request{Op: opRegister, Child: &child})
		switch {
		case err == nil:
			return *resp.Listen, nil
		case !errors.Is(err, ErrExiting) && !errors.Is(err, ErrNotRunning):
			return Addr{}, err
		}
		// The broker was on its way out: the next one will do.
		select {
		case <-ctx.Done():
			return Addr{}, fmt.Errorf("broker: register %q: %w", child.Name, ctx.Err())
		case <-tick.C:
		}
	}
}

// Unregister forgets machine name. With no broker running, it removes the
// machine from the registry file itself (under the broker's lock), so no
// broker started later serves it.
func (c *Client) Unregister(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		_, err := c.call(ctx, request{Op: opUnregister, Name: name})
		if err == nil || !errors.Is(err, ErrNotRunning) {
			return err
		}
		unlock, free, lerr := tryLock(c.Dir)
		if lerr != nil {
			return lerr
		}
		if free {
			defer unlock()
			return removeFromRegistry(c.Dir, name)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("broker: unregister %q: %w", name, ctx.Err())
		case <-tick.C:
		}
	}
}

func removeFromRegistry(dir, name string) error {
	children, err := readRegistry(dir)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	kept := children[:0]
	for _, ch := range children {
		if ch.Name != name {
			kept = append(kept, ch)
		}
	}
	if len(kept) == len(children) {
		return nil
	}
	if len(kept) == 0 {
		return os.Remove(filepath.Join(dir, RegistryFile))
	}
	return writeRegistry(dir, kept)
}

// List returns the machines the running broker serves (ErrNotRunning if
// none runs).
func (c *Client) List(ctx context.Context) ([]Status, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	resp, err := c.call(ctx, request{Op: opList})
	if err != nil {
		return nil, err
	}
	if resp.Children == nil {
		return []Status{}, nil
	}
	return resp.Children, nil
}

// Revive starts a broker if the registry lists a machine and none runs
// (one that died, or was killed): the new broker serves them again. A
// vmfork command calls it on its way in, as it repairs interrupted forks,
// so a dead broker is replaced at the next command. It then returns the
// machines that lost an env value in the restart; registering them again
// restores it.
func (c *Client) Revive(ctx context.Context) ([]Status, error) {
	children, err := readRegistry(c.Dir)
	if err != nil || len(children) == 0 {
		return nil, err
	}
	if err := c.Ensure(ctx); err != nil {
		return nil, err
	}
	list, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	var lost []Status
	for _, st := range list {
		for _, sec := range st.Secrets {
			if !sec.HasValue {
				lost = append(lost, st)
				break
			}
		}
	}
	return lost, nil
}

// PID returns the running broker's PID, or 0 when none runs.
func (c *Client) PID() int {
	data, err := os.ReadFile(filepath.Join(c.Dir, PIDFile))
	if err != nil {
		return 0
	}
	if unlock, free, _ := tryLock(c.Dir); free {
		unlock() // a stale file: nobody holds the lock
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}
