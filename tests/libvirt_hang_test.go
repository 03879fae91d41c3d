//go:build integration

package tests

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A libvirt daemon that stops answering (hung, or stopped with SIGSTOP) must
// fail the command within the driver's bound, naming the call, and leave no
// source paused. The shared libvirtd is never stopped (other tests use it):
// a test talks to it through a proxy of its own, which can stop forwarding
// the moment vmfork sends a chosen call, exactly as a daemon stopped at that
// moment looks to this one client.

// libvirt RPC procedure numbers (remote_protocol.x).
const (
	procDomainLookupByName = 23
	procDomainResume       = 28
	remoteProgram          = 0x20008086
)

// hangBound is VMFORK_LIBVIRT_TIMEOUT in these tests, and hangSlack what a
// loaded host may add to it before the command has failed.
const (
	hangBound = 6 * time.Second
	hangSlack = 20 * time.Second
)

// libvirtProxy forwards a unix socket to libvirtd's until a client sends
// procedure freezeAt; from then on it forwards nothing, in either direction,
// on any connection, old or new, while keeping every socket open.
type libvirtProxy struct {
	sock     string
	ln       net.Listener
	freezeAt atomic.Int32 // 0: never
	frozen   atomic.Bool
	mu       sync.Mutex
	conns    []net.Conn
}

// startLibvirtProxy listens on a socket in a temp dir, closed when t ends.
func startLibvirtProxy(t *testing.T) *libvirtProxy {
	t.Helper()
	p := &libvirtProxy{sock: filepath.Join(t.TempDir(), "libvirt-sock")}
	ln, err := net.Listen("unix", p.sock)
	if err != nil {
		t.Fatal(err)
	}
	p.ln = ln
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	return p
}

// uri is the libvirt URI that reaches the daemon through the proxy.
func (p *libvirtProxy) uri() string { return "qemu:///system?socket=" + p.sock }

func (p *libvirtProxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = append(p.conns, c)
}

func (p *libvirtProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		if p.frozen.Load() {
			continue // accepted, never answered
		}
		d, err := net.Dial("unix", "/run/libvirt/libvirt-sock")
		if err != nil {
			c.Close()
			continue
		}
		p.track(d)
		go p.fromClient(c.(*net.UnixConn), d.(*net.UnixConn))
		go p.fromDaemon(d.(*net.UnixConn), c.(*net.UnixConn))
	}
}

// fromClient forwards what the client sends, with the descriptors it
// passes (SCM_RIGHTS: libvirt hands QEMU files this way), and follows the
// message framing (a 4-byte length, then program, version, procedure) so
// that it can hold back the message that freezes the proxy and all after it.
func (p *libvirtProxy) fromClient(c, d *net.UnixConn) {
	var hdr []byte
	remain := 0 // bytes left of the message being forwarded
	buf, oob := make([]byte, 64<<10), make([]byte, syscall.CmsgSpace(64*4))
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if n == 0 || err != nil || p.frozen.Load() {
			closeRights(oob[:oobn])
			if err != nil || n == 0 {
				return
			}
			continue // frozen: read and dropped, never answered
		}
		// libvirt passes each descriptor with one byte of its own, outside
		// the message framing, and a read ends with it (Linux stops a
		// stream read at a message carrying descriptors).
		data := n
		if oobn > 0 {
			data = n - 1
		}
		fwd := n
		for i := 0; i < data; {
			if remain > 0 {
				k := min(remain, data-i)
				i, remain = i+k, remain-k
				continue
			}
			start := i
			k := min(16-len(hdr), data-i)
			hdr, i = append(hdr, buf[i:i+k]...), i+k
			if len(hdr) < 16 {
				continue
			}
			length := int(binary.BigEndian.Uint32(hdr[0:]))
			prog, proc := binary.BigEndian.Uint32(hdr[4:]), int32(binary.BigEndian.Uint32(hdr[12:]))
			hdr, remain = hdr[:0], max(0, length-16)
			if f := p.freezeAt.Load(); f != 0 && prog == remoteProgram && proc == f {
				p.frozen.Store(true)
				fwd = start
				break
			}
		}
		err = forward(d, buf[:fwd], oob[:oobn], fwd == n)
		closeRights(oob[:oobn])
		if err != nil {
			return
		}
	}
}

// forward writes data to c and, with rights, oob with data's last byte
// alone, as libvirt sent it: a reader that does not expect descriptors
// drops those that come with its bytes.
func forward(c *net.UnixConn, data, oob []byte, rights bool) error {
	if !rights || len(oob) == 0 {
		_, err := c.Write(data)
		return err
	}
	if len(data) > 1 {
		if _, err := c.Write(data[:len(data)-1]); err != nil {
			return err
		}
	}
	_, _, err := c.WriteMsgUnix(data[len(data)-1:], oob, nil)
	return err
}

// fromDaemon forwards the daemon's messages, and its descriptors, until the
// proxy freezes.
func (p *libvirtProxy) fromDaemon(d, c *net.UnixConn) {
	buf, oob := make([]byte, 64<<10), make([]byte, syscall.CmsgSpace(64*4))
	for {
		n, oobn, _, _, err := d.ReadMsgUnix(buf, oob)
		if n > 0 && !p.frozen.Load() {
			if werr := forward(c, buf[:n], oob[:oobn], true); werr != nil {
				closeRights(oob[:oobn])
				return
			}
		}
		closeRights(oob[:oobn])
		if err != nil || n == 0 {
			return
		}
	}
}

// closeRights closes this process's copies of the descriptors in oob, once
// they are passed on (or dropped).
func closeRights(oob []byte) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			syscall.Close(fd)
		}
	}
}

// hangCheck runs the CLI through a frozen daemon and checks that it fails
// within the bound, in one line that says what it names.
func hangCheck(t *testing.T, d *driverEnv, uri string, names []string, args ...string) result {
	t.Helper()
	// Killed once well past the bound: a vmfork that hangs fails the test
	// here, not at go test's own timeout.
	ctx, cancel := context.WithTimeout(t.Context(), 2*(hangBound+hangSlack))
	defer cancel()
	cmd := exec.CommandContext(ctx, d.bin, append([]string{"--state-dir", d.stateDir, "--mem-dir", d.memDir, "--connect", uri}, args...)...)
	cmd.Env = append(os.Environ(), "VMFORK_LIBVIRT_TIMEOUT="+hangBound.String())
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	}
	if ctx.Err() != nil {
		t.Fatalf("vmfork %v still waited for a daemon that does not answer after %v: killed", args, took.Round(time.Second))
	}
	if r.code == 0 {
		t.Errorf("vmfork %v against a daemon that does not answer: %s, want a failure", args, r)
	}
	if took > hangBound+hangSlack {
		t.Errorf("vmfork %v took %v against a daemon that does not answer, want under %v", args, took, hangBound+hangSlack)
	}
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	last := lines[len(lines)-1]
	for _, n := range names {
		if !strings.Contains(last, n) {
			t.Errorf("vmfork %v: error %q does not name %q", args, last, n)
		}
	}
	if t.Failed() {
		t.Logf("stderr of vmfork %v:\n%s", args, r.stderr)
	}
	t.Logf("vmfork %v failed after %v: %s", args, took.Round(100*time.Millisecond), last)
	return r
}

// TestLibvirtHungConnect: a socket that accepts and never answers (a daemon
// stopped before vmfork connects) fails ls within the bound, naming
// virConnectOpen.
func TestLibvirtHungConnect(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, nil)
	sock := filepath.Join(t.TempDir(), "libvirt-sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err == nil {
				held = append(held, c) // read by no one: no answer ever
			}
		}
	}()
	r := hangCheck(t, d, "qemu:///system?socket="+sock, []string{"virConnectOpen", "no answer from libvirt within " + hangBound.String()}, "ls")
	if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n != 0 {
		t.Errorf("error is %d lines, want one: %q", n+1, r.stderr)
	}
	assertNothingCreated(t, d.env)
}

// TestLibvirtHungCalls: the daemon stops answering in the middle of a
// command (keepalive closes the connection): a lookup fails naming it, and
// a fork whose source libvirt paused and was then asked to resume leaves the
// source for the next command to resume, which it does.
func TestLibvirtHungCalls(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	src := d.n("src")
	d.bootGuest(src)
	d.run(src, "vmfork-counter", "start")

	p := startLibvirtProxy(t)
	p.freezeAt.Store(procDomainLookupByName)
	r := hangCheck(t, d, p.uri(), []string{"virDomainLookupByName", "did not answer"}, "exec", src, "--", "true")
	if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n != 0 {
		t.Errorf("error is %d lines, want one: %q", n+1, r.stderr)
	}

	// ls against a daemon that stops answering after the connect fails
	// naming the call, rather than showing states it could not check.
	p3 := startLibvirtProxy(t)
	p3.freezeAt.Store(procDomainLookupByName)
	hangCheck(t, d, p3.uri(), []string{"virDomainLookupByName", "did not answer", src}, "ls")

	// The daemon hangs at the fork's resume: libvirt has paused the source.
	p2 := startLibvirtProxy(t)
	p2.freezeAt.Store(procDomainResume)
	before := d.count(src)
	hangCheck(t, d, p2.uri(), []string{"virDomainResume", "did not answer"}, "fork", src, d.n("c"))
	if !p2.frozen.Load() {
		t.Fatal("the fork never asked libvirt to resume its source")
	}
	// The next command, on a daemon that answers, finds the source paused by
	// an interrupted fork and resumes it; the half-made fork leaves nothing.
	ms := d.machines()
	if m, ok := ms[src]; !ok || m.State != "running" {
		t.Errorf("source after the hung fork and a repair: %+v, want running", m)
	}
	if st := strings.TrimSpace(virshOK(t, "domstate", src)); st != "running" {
		t.Errorf("virsh domstate %s = %q, want running", src, st)
	}
	for name := range ms {
		if name != src {
			t.Errorf("machine %s left by the hung fork", name)
		}
	}
	if ds := domains(t, d.prefix); len(ds) != 1 || ds[0] != src {
		t.Errorf("domains after the hung fork = %v, want only %s", ds, src)
	}
	if after := d.count(src); after <= before {
		t.Errorf("source counter %d after the hung fork, want more than %d", after, before)
	}
	d.cliOK("fork", src, d.n("c"))
	d.cliOK("rm", d.n("c"), src)
}
