package ledger

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"syscall"
	"time"
)

// Client is how vmfork commands reach the ledger: through the server's
// control socket, or, when no server runs, by opening the Store under the
// server's lock (so `vmfork ledger NAME` works with no machine running).
// The zero Wait means 10 s.
type Client struct {
	// Dir is the ledger directory (vmfork: <state-dir>/ledger).
	Dir string
	// Start starts a server for Dir (vmfork: `vmfork ledger-server`,
	// detached) and returns without waiting for it. Nil: Attach fails with
	// ErrNoServer when none runs.
	Start func(ctx context.Context) error
	// Limits must be the server's: they apply when the Client opens the
	// Store itself.
	Limits Limits
	// Wait bounds how long a call waits for a server to start, or for the
	// lock while a server starts or exits.
	Wait time.Duration
}

func (c *Client) wait() time.Duration {
	if c.Wait > 0 {
		return c.Wait
	}
	return 10 * time.Second
}

// call sends one request; ErrNoServer when nothing listens.
func (c *Client) call(ctx context.Context, req ctlRequest) (ctlResponse, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(c.Dir, FileControl))
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return ctlResponse{}, fmt.Errorf("%s: %w", c.Dir, ErrNoServer)
		}
		return ctlResponse{}, fmt.Errorf("ledger: %w", err)
	}
	defer conn.Close()
	deadline := time.Now().Add(ctlDeadline)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	js, err := json.Marshal(req)
	if err != nil {
		return ctlResponse{}, err
	}
	if _, err := conn.Write(append(js, '\n')); err != nil {
		return ctlResponse{}, fmt.Errorf("ledger: %w", err)
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return ctlResponse{}, ctx.Err()
		}
		if errors.Is(err, io.EOF) {
			// Accepted, then closed unanswered: the server was exiting.
			return ctlResponse{}, fmt.Errorf("%s: %w", c.Dir, ErrNoServer)
		}
		return ctlResponse{}, fmt.Errorf("ledger: %w", err)
	}
	var resp ctlResponse
	if err := json.Unmarshal(line, &resp); err != nil {
		return ctlResponse{}, fmt.Errorf("ledger: bad response: %w", err)
	}
	return resp, resp.err()
}

// Ping returns nil when a server answers, else ErrNoServer.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.call(ctx, ctlRequest{Op: "ping"})
	return err
}

// Ensure returns once a server answers, starting one (Start) when none
// does: what the Manager calls when a machine starts running.
func (c *Client) Ensure(ctx context.Context) error {
	if c.Ping(ctx) == nil {
		return nil
	}
	if c.Start == nil {
		return fmt.Errorf("%s: %w (and none can be started here)", c.Dir, ErrNoServer)
	}
	if err := c.Start(ctx); err != nil {
		return fmt.Errorf("start the ledger server: %w", err)
	}
	return c.retry(ctx, func() error { return c.Ping(ctx) })
}

// retry calls fn until it does not fail with ErrNoServer (a server
// starting, or exiting to make room for the next), for up to Wait.
func (c *Client) retry(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(c.wait())
	for {
		err := fn()
		var fe finalError
		if errors.As(err, &fe) {
			return fe.err
		}
		if !errors.Is(err, ErrNoServer) && !errors.Is(err, errClosing) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// finalError stops retry at once.
type finalError struct{ err error }

func (e finalError) Error() string { return e.err.Error() }

// Attach registers a running machine with the server, starting the server
// if none runs: call it whenever a machine's QEMU has started (boot,
// fork, resume, start, rewind). It is idempotent.
func (c *Client) Attach(ctx context.Context, m Machine) error {
	if err := m.check(); err != nil {
		return err
	}
	err := c.retry(ctx, func() error {
		_, err := c.call(ctx, ctlRequest{Op: "attach", Machine: &m})
		if errors.Is(err, ErrNoServer) || errors.Is(err, errClosing) {
			if err := c.Ensure(ctx); err != nil {
				return finalError{err}
			}
			_, err = c.call(ctx, ctlRequest{Op: "attach", Machine: &m})
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("ledger: attach %q: %w", m.Name, err)
	}
	return nil
}

// Detach unregisters a machine whose QEMU stops or goes (stop, rm,
// hibernate, before a rewind replaces it). With no server running, it
// removes the machine from the saved registrations. It is idempotent.
func (c *Client) Detach(ctx context.Context, name string) error {
	_, err := c.do(ctx, ctlRequest{Op: "detach", Name: name}, func(*Store) ([]Record, error) {
		ms, err := loadMachines(c.Dir)
		if err != nil {
			return nil, err
		}
		kept := ms[:0]
		for _, m := range ms {
			if m.Name != name {
				kept = append(kept, m)
			}
		}
		if len(kept) == len(ms) {
			return nil, nil
		}
		return nil, saveMachines(c.Dir, kept)
	})
	if err != nil {
		return fmt.Errorf("ledger: detach %q: %w", name, err)
	}
	return nil
}

// Machines returns the machines the server serves (none when no server
// runs).
func (c *Client) Machines(ctx context.Context) ([]MachineStatus, error) {
	resp, err := c.call(ctx, ctlRequest{Op: "machines"})
	if errors.Is(err, ErrNoServer) {
		return []MachineStatus{}, nil
	}
	if resp.Machines == nil {
		resp.Machines = []MachineStatus{}
	}
	return resp.Machines, err
}

// do sends req to the server or, when none runs, runs offline on the
// Store under the server's lock.
func (c *Client) do(ctx context.Context, req ctlRequest, offline func(*Store) ([]Record, error)) ([]Record, error) {
	var out []Record
	err := c.retry(ctx, func() error {
		resp, err := c.call(ctx, req)
		if !errors.Is(err, ErrNoServer) {
			out = resp.Records
			return err
		}
		unlock, ok, lerr := tryLock(c.Dir)
		if lerr != nil {
			return lerr
		}
		if !ok {
			return err // a server starting or exiting holds it: retry
		}
		defer unlock()
		st, serr := OpenStore(c.Dir, StoreOptions{Limits: c.Limits})
		if serr != nil {
			return serr
		}
		defer st.Close()
		out, err = offline(st)
		return err
	})
	if out == nil {
		out = []Record{}
	}
	return out, err
}

func (c *Client) records(ctx context.Context, req ctlRequest) ([]Record, error) {
	return c.do(ctx, req, func(st *Store) ([]Record, error) { return storeOp(st, req) })
}

// List returns the family's records, sorted by key.
func (c *Client) List(ctx context.Context, family string) ([]Record, error) {
	return c.records(ctx, ctlRequest{Op: "list", Family: family})
}

// Get returns one record, or ErrNotFound.
func (c *Client) Get(ctx context.Context, family, key string) (Record, error) {
	rs, err := c.records(ctx, ctlRequest{Op: "get", Family: family, Key: key})
	if err != nil || len(rs) == 0 {
		return Record{}, err
	}
	return rs[0], nil
}

// Release releases key, whoever holds it (vmfork ledger NAME --release
// KEY), and returns the released record; ErrNotClaimed when nobody holds
// it.
func (c *Client) Release(ctx context.Context, family, key string) (Record, error) {
	rs, err := c.records(ctx, ctlRequest{Op: "release", Family: family, Key: key})
	if err != nil || len(rs) == 0 {
		return Record{}, err
	}
	return rs[0], nil
}

// ReleaseHeldBy releases every key machine holds and has not done, and
// returns them: for explore, when it reaps a losing branch.
func (c *Client) ReleaseHeldBy(ctx context.Context, family, machine string) ([]Record, error) {
	return c.records(ctx, ctlRequest{Op: "release_held_by", Family: family, Name: machine})
}

// KeysOf returns the records machine holds or held (any state): for
// explore, the keys a branch claimed.
func (c *Client) KeysOf(ctx context.Context, family, machine string) ([]Record, error) {
	return c.records(ctx, ctlRequest{Op: "keys_of", Family: family, Name: machine})
}
