package qmptest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Greeting is the greeting the QMP fake sends: QEMU 7.2.22 as packaged by Debian 12, which offers
// the "oob" capability.
const Greeting = `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, ` +
	`"package": "Debian 1:7.2+dfsg-7+deb12u18"}, "capabilities": ["oob"]}}`

// NewServer starts a fake QEMU QMP server on a unix socket and returns the socket's path. It
// follows script on the connection it accepts; see the package documentation. The server stops
// and reports its findings in tb.Cleanup.
func NewServer(tb testing.TB, script ...Step) string {
	tb.Helper()
	return start(tb, false, script)
}

// command is a command as the fake received it.
type command struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

type server struct {
	tb     testing.TB
	agent  bool
	ln     *net.UnixListener
	script []Step
	stop   chan struct{} // closed by Cleanup
	done   chan struct{} // closed when serve returns

	mu      sync.Mutex
	conn    net.Conn // the current connection, so Cleanup can close it
	next    int      // index of the next step
	errs    []error
	aborted bool
}

func start(tb testing.TB, agent bool, script []Step) string {
	tb.Helper()
	// Not tb.TempDir: a unix socket path must fit in 108 bytes, and tb.TempDir's path grows with
	// the test's name.
	dir, err := os.MkdirTemp("", "qmptest")
	if err != nil {
		tb.Fatalf("qmptest: %v", err)
	}
	path := filepath.Join(dir, "s.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		os.RemoveAll(dir)
		tb.Fatalf("qmptest: %v", err)
	}
	s := &server{
		tb:     tb,
		agent:  agent,
		ln:     ln,
		script: script,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	go s.serve()
	tb.Cleanup(func() {
		close(s.stop)
		ln.Close()
		s.mu.Lock()
		if s.conn != nil {
			s.conn.Close()
		}
		s.mu.Unlock()
		<-s.done
		os.RemoveAll(dir)
		s.report()
	})
	return path
}

func (s *server) serve() {
	defer close(s.done)
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		s.mu.Lock()
		select {
		case <-s.stop:
			s.mu.Unlock()
			c.Close()
			return
		default:
		}
		s.conn = c
		s.mu.Unlock()

		ss := &session{s: s, c: c}
		if s.agent {
			ss.br = bufio.NewReader(c)
		} else {
			ss.fr = &fdReader{c: c}
			ss.dec = json.NewDecoder(ss.fr)
		}
		ss.run()
		c.Close()
		ss.fr.closeAll()
		s.mu.Lock()
		aborted := s.aborted
		s.mu.Unlock()
		if aborted {
			return
		}
	}
}

func (s *server) errorf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, fmt.Errorf(format, args...))
}

// current returns the next step, or false at the end of the script.
func (s *server) current() (int, Step, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next >= len(s.script) {
		return s.next, Step{}, false
	}
	return s.next, s.script[s.next], true
}

func (s *server) advance() {
	s.mu.Lock()
	s.next++
	s.mu.Unlock()
}

func (s *server) abort() {
	s.mu.Lock()
	s.aborted = true
	s.mu.Unlock()
}

func (s *server) report() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, err := range s.errs {
		s.tb.Errorf("qmptest: %v", err)
	}
	if s.tb.Failed() {
		return // leftover steps are a consequence, not news
	}
	for i := s.next; i < len(s.script); i++ {
		if s.script[i].kind == kindExpect {
			s.tb.Errorf("qmptest: script not finished: step %d, command %q, never arrived", i, s.script[i].command)
			return
		}
	}
}

// session is the script running on one accepted connection.
type session struct {
	s    *server
	c    *net.UnixConn
	dec  *json.Decoder // QMP
	fr   *fdReader     // QMP
	br   *bufio.Reader // agent
	late [][]byte      // replies held back by Late
}

func (ss *session) run() {
	s := ss.s
	if !s.agent {
		if ss.write([]byte(Greeting+"\n")) != nil {
			return
		}
		cmd, err := ss.read()
		if err != nil {
			return
		}
		if cmd.Execute != "qmp_capabilities" {
			s.errorf("got command %q, want qmp_capabilities first", cmd.Execute)
			s.abort()
			return
		}
		if ss.reply(cmd, Step{}) != nil {
			return
		}
	}
	for {
		idx, st, ok := s.current()
		if !ok {
			ss.afterScript()
			return
		}
		var err error
		switch st.kind {
		case kindEmit:
			err = ss.emit(st.events)
		case kindRaw:
			err = ss.write(st.raw)
		case kindDisconnect:
			s.advance()
			return
		case kindWait:
			select {
			case <-st.wait:
			case <-s.stop:
				return
			}
		case kindExpect:
			if !ss.expect(idx, st) {
				return
			}
			continue // expect advanced the script itself
		}
		if err != nil {
			return
		}
		s.advance()
	}
}

// expect runs an Expect step and reports whether the session may go on.
func (ss *session) expect(idx int, st Step) bool {
	s := ss.s
	cmd, err := ss.read()
	if err != nil {
		return false // the client went away; report() flags the step if it mattered
	}
	s.advance() // the step is used up even if its checks fail
	if cmd.Execute != st.command {
		s.errorf("step %d: got command %q, want %q", idx, cmd.Execute, st.command)
		s.abort()
		return false
	}
	if st.args != nil {
		if err := st.args(cmd.Arguments); err != nil {
			s.errorf("step %d: %s: %v", idx, cmd.Execute, err)
		}
	}
	if st.fd != nil {
		ss.receiveFD(idx, cmd.Execute, st.fd)
	}
	if ss.emit(st.events) != nil {
		return false
	}
	switch {
	case st.noReply:
		return true
	case st.late:
		ss.late = append(ss.late, replyLine(cmd.ID, st.ret, st.fail))
		return true
	}
	return ss.reply(cmd, st) == nil
}

func (ss *session) receiveFD(idx int, name string, fn func(*os.File) error) {
	if ss.fr == nil || len(ss.fr.fds) == 0 {
		ss.s.errorf("step %d: %s: no file descriptor was passed", idx, name)
		return
	}
	fd := ss.fr.fds[0]
	ss.fr.fds = ss.fr.fds[1:]
	f := os.NewFile(uintptr(fd), "passed-fd")
	defer f.Close()
	if err := fn(f); err != nil {
		ss.s.errorf("step %d: %s: passed file: %v", idx, name, err)
	}
}

// afterScript answers any further command with an error and records it as unexpected.
func (ss *session) afterScript() {
	for {
		cmd, err := ss.read()
		if err != nil {
			return
		}
		ss.s.errorf("unexpected command %q after the end of the script", cmd.Execute)
		st := Step{fail: &errorBody{Class: "GenericError", Desc: "qmptest: unexpected command"}}
		if ss.reply(cmd, st) != nil {
			return
		}
	}
}

func (ss *session) read() (command, error) {
	if ss.s.agent {
		return ss.readAgent()
	}
	var cmd command
	if err := ss.dec.Decode(&cmd); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			ss.s.errorf("client sent invalid JSON: %v", err)
		}
		return command{}, err
	}
	return cmd, nil
}

// reply sends the late replies, then the reply st describes.
func (ss *session) reply(cmd command, st Step) error {
	if err := ss.flushLate(); err != nil {
		return err
	}
	return ss.write(replyLine(cmd.ID, st.ret, st.fail))
}

func (ss *session) flushLate() error {
	for len(ss.late) > 0 {
		if err := ss.write(ss.late[0]); err != nil {
			return err
		}
		ss.late = ss.late[1:]
	}
	return nil
}

func (ss *session) emit(evs []Event) error {
	for _, ev := range evs {
		now := time.Now()
		m := map[string]any{
			"event":     ev.Name,
			"timestamp": map[string]int64{"seconds": now.Unix(), "microseconds": int64(now.Nanosecond() / 1000)},
		}
		if ev.Data != nil {
			m["data"] = ev.Data
		}
		b, err := json.Marshal(m)
		if err != nil {
			ss.s.errorf("event %s: encode data: %v", ev.Name, err)
			return err
		}
		if err := ss.write(append(b, '\n')); err != nil {
			return err
		}
	}
	return nil
}

func (ss *session) write(b []byte) error {
	_, err := ss.c.Write(b)
	return err
}

func replyLine(id json.RawMessage, ret any, fail *errorBody) []byte {
	m := map[string]any{}
	if fail != nil {
		m["error"] = fail
	} else {
		if ret == nil {
			ret = struct{}{}
		}
		m["return"] = ret
	}
	if len(id) > 0 {
		m["id"] = id
	}
	b, err := json.Marshal(m)
	if err != nil {
		// An unencodable Return value is a bug in the test; make the client see it.
		b, _ = json.Marshal(map[string]any{"error": errorBody{"GenericError", "qmptest: " + err.Error()}, "id": id})
	}
	return append(b, '\n')
}

// fdReader reads the QMP stream and collects descriptors passed with SCM_RIGHTS.
type fdReader struct {
	c   *net.UnixConn
	fds []int
}

func (r *fdReader) Read(p []byte) (int, error) {
	oob := make([]byte, unix.CmsgSpace(8*4))
	n, oobn, _, _, err := r.c.ReadMsgUnix(p, oob)
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr == nil {
			for i := range msgs {
				if fds, err := unix.ParseUnixRights(&msgs[i]); err == nil {
					r.fds = append(r.fds, fds...)
				}
			}
		}
	}
	if n == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

func (r *fdReader) closeAll() {
	if r == nil {
		return
	}
	for _, fd := range r.fds {
		unix.Close(fd)
	}
	r.fds = nil
}
