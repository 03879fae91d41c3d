package ledger

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// The control socket: one JSON request per connection, one JSON response.
// Only the user who runs vmfork can connect (the socket is 0600 in a 0700
// directory); guests never reach it.

const (
	ctlMaxRequest = 64 << 10
	ctlDeadline   = 30 * time.Second
)

type ctlRequest struct {
	Op      string   `json:"op"`
	Machine *Machine `json:"machine,omitempty"`
	// Name is a machine's name (detach, release_held_by, keys_of).
	Name   string `json:"name,omitempty"`
	Family string `json:"family,omitempty"`
	Key    string `json:"key,omitempty"`
}

type ctlResponse struct {
	Error    string          `json:"error,omitempty"`
	Code     string          `json:"code,omitempty"`
	Holder   string          `json:"holder,omitempty"`
	Records  []Record        `json:"records,omitempty"`
	Machines []MachineStatus `json:"machines,omitempty"`
}

// Error codes of the control socket, one per sentinel.
var ctlCodes = []struct {
	code string
	err  error
}{
	{"invalid", ErrInvalid},
	{"not_found", ErrNotFound},
	{"not_holder", ErrNotHolder},
	{"not_claimed", ErrNotClaimed},
	{"already_done", ErrAlreadyDone},
	{"full", ErrFull},
	{"storage", ErrStorage},
	{"corrupt", ErrCorrupt},
	{"closing", errClosing},
	{"closing", errClosed},
}

func errResponse(err error) ctlResponse {
	r := ctlResponse{Error: err.Error()}
	for _, c := range ctlCodes {
		if errors.Is(err, c.err) {
			r.Code = c.code
			break
		}
	}
	var he *HolderError
	if errors.As(err, &he) {
		r.Holder = he.Holder
	}
	return r
}

func (r ctlResponse) err() error {
	if r.Error == "" && r.Code == "" {
		return nil
	}
	if r.Code == "not_holder" {
		return &HolderError{Holder: r.Holder}
	}
	for _, c := range ctlCodes {
		if c.code == r.Code {
			return fmt.Errorf("ledger server: %s: %w", r.Error, c.err)
		}
	}
	return fmt.Errorf("ledger server: %s", r.Error)
}

// listenControl listens on path, replacing a stale socket (the caller
// holds the lock, so no live server owns it), readable by its owner only.
func listenControl(path string) (net.Listener, error) {
	os.Remove(path)
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("ledger control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("ledger control socket: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	return ln, nil
}

func (s *Server) accept(ln net.Listener, handlers *sync.WaitGroup) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			defer conn.Close()
			s.control(conn)
		}()
	}
}

func (s *Server) control(conn net.Conn) {
	conn.SetDeadline(time.Now().Add(ctlDeadline))
	var req ctlRequest
	var resp ctlResponse
	line, err := bufio.NewReader(io.LimitReader(conn, ctlMaxRequest)).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &req)
	}
	if err != nil {
		resp = errResponse(fmt.Errorf("bad request: %w: %w", err, ErrInvalid))
	} else {
		resp = s.controlOp(req)
	}
	js, _ := json.Marshal(resp)
	conn.Write(append(js, '\n'))
}

func (s *Server) controlOp(req ctlRequest) ctlResponse {
	var resp ctlResponse
	var err error
	switch req.Op {
	case "ping":
		// A server on its way out says so: a server starting meanwhile
		// waits for its lock instead of taking it for the one that runs.
		s.mu.Lock()
		if s.closing {
			err = errClosing
		}
		s.mu.Unlock()
	case "attach":
		if req.Machine == nil {
			err = fmt.Errorf("attach: no machine: %w", ErrInvalid)
			break
		}
		err = s.Attach(*req.Machine)
	case "detach":
		err = s.Detach(req.Name)
	case "machines":
		resp.Machines = s.Machines()
	default:
		resp.Records, err = storeOp(s.store, req)
	}
	if err != nil {
		return errResponse(err)
	}
	return resp
}

// storeOp runs a record request on st: the server's, or the Client's own
// when no server runs.
func storeOp(st *Store, req ctlRequest) ([]Record, error) {
	switch req.Op {
	case "list":
		return st.List(req.Family)
	case "get":
		r, err := st.Get(req.Family, req.Key)
		return []Record{r}, err
	case "release":
		r, err := st.Release(req.Family, req.Key)
		return []Record{r}, err
	case "release_held_by":
		return st.ReleaseHeldBy(req.Family, req.Name)
	case "keys_of":
		return st.KeysOf(req.Family, req.Name)
	}
	return nil, fmt.Errorf("unknown op %q: %w", req.Op, ErrInvalid)
}
