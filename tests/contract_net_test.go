//go:build integration

package tests

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Issue 22's egress on the networks users have: a bridge with a DHCP
// server (embedded driver: nftables on the child's tap) and an isolated
// libvirt network (libvirt driver: a network filter of the child's own).
// The test servers listen in the bridge's network namespace, or on the
// libvirt network's host address: no traffic leaves this machine.

// netServers are two TCP echo servers and a UDP sink on every address of
// one network namespace (python3, Debian's), started by the test.
type netServers struct {
	tcp, tcpOther, udp int
	sink               string // the UDP sink's log: one line per datagram
}

const serversScript = `
import socket, sys, threading
def tcp():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 0))
    s.listen(64)
    return s
def serve(s):
    while True:
        c, _ = s.accept()
        def echo(c):
            try:
                line = c.makefile("rb").readline()
                c.sendall(b"echo " + line)
            finally:
                c.close()
        threading.Thread(target=echo, args=(c,), daemon=True).start()
t1, t2 = tcp(), tcp()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("0.0.0.0", 0))
print(t1.getsockname()[1], t2.getsockname()[1], u.getsockname()[1], flush=True)
for s in (t1, t2):
    threading.Thread(target=serve, args=(s,), daemon=True).start()
with open(sys.argv[1], "a") as f:
    while True:
        d, _ = u.recvfrom(2048)
        f.write(d.decode("latin1", "replace") + "\n")
        f.flush()
`

// startNetServers starts netServers in namespace ns ("" for the host's)
// and stops them when the test ends.
func startNetServers(t *testing.T, ns string) *netServers {
	t.Helper()
	dir := t.TempDir()
	s := &netServers{sink: filepath.Join(dir, "udp.log")}
	argv := []string{"python3", "-c", serversScript, s.sink}
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the test servers: %v", err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if _, serr := fmt.Sscan(line, &s.tcp, &s.tcpOther, &s.udp); err != nil || serr != nil {
		t.Fatalf("the test servers did not say their ports: %q, %v, %v", line, err, serr)
	}
	return s
}

var netProbeSeq atomic.Int64

// probe runs a guest command through run (a driver env's exec) and reports
// whether machine name reached ip over TCP port (an echo) or, for udp, got
// a datagram to the sink.
type guestRunner func(name string, argv ...string) (string, error)

func (s *netServers) reachesTCP(run guestRunner, name, ip string, port int) bool {
	out, _ := run(name, "sh", "-c", fmt.Sprintf("echo hi | nc -w 3 %s %d", ip, port))
	return strings.Contains(out, "echo hi")
}

func (s *netServers) reachesUDP(run guestRunner, name, ip string) bool {
	token := fmt.Sprintf("probe-%s-%d", name, netProbeSeq.Add(1))
	run(name, "timeout", "3", "tftp", "-g", "-r", token, "-l", "/dev/null", ip, strconv.Itoa(s.udp))
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(s.sink); strings.Contains(string(b), token) {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// hostsMu serializes the tests' edits of /etc/hosts (read, change, write
// back): tests that run in parallel add and remove lines of their own.
var hostsMu sync.Mutex

// hostsEntry makes name resolve to ip on the host (/etc/hosts) for the
// test, and takes the line out again when it ends: an allow list's names
// are resolved on the host.
func hostsEntry(t *testing.T, ip, name string) {
	t.Helper()
	hostsMu.Lock()
	defer hostsMu.Unlock()
	line := ip + " " + name + " # vmfork test " + t.Name() + "\n"
	f, err := os.OpenFile("/etc/hosts", os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(line)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		hostsMu.Lock()
		defer hostsMu.Unlock()
		b, err := os.ReadFile("/etc/hosts")
		if err != nil {
			t.Errorf("read /etc/hosts: %v", err)
			return
		}
		if err := os.WriteFile("/etc/hosts", []byte(strings.Replace(string(b), line, "", 1)), 0o644); err != nil {
			t.Errorf("take the test's line out of /etc/hosts: %v", err)
		}
	})
}

// egressChecks runs the checks on a network: a child with egress
// none, one with an allow list naming one TCP port by a host-resolved
// name, and their parent, with no contract, as before.
func egressChecks(t *testing.T, s *netServers, run guestRunner, parent, none, allow, gw string) {
	t.Run("none", func(t *testing.T) {
		if s.reachesTCP(run, none, gw, s.tcp) || s.reachesUDP(run, none, gw) {
			t.Error("a child with egress none reached the servers its parent reaches")
		}
	})
	t.Run("allow", func(t *testing.T) {
		if !s.reachesTCP(run, allow, gw, s.tcp) {
			t.Error("a child allowed NAME:PORT does not reach it")
		}
		if s.reachesTCP(run, allow, gw, s.tcpOther) || s.reachesUDP(run, allow, gw) {
			t.Error("a child allowed one TCP port reached another port or UDP")
		}
		if s.reachesTCP(run, allow, "169.254.169.254", s.tcp) {
			t.Error("a child reached 169.254.169.254, which its parent reaches")
		}
	})
	t.Run("parent unchanged", func(t *testing.T) {
		if !s.reachesTCP(run, parent, gw, s.tcp) || !s.reachesTCP(run, parent, gw, s.tcpOther) || !s.reachesUDP(run, parent, gw) {
			t.Error("the children's contracts changed what their parent reaches")
		}
		if !s.reachesTCP(run, parent, "169.254.169.254", s.tcp) {
			t.Error("the parent does not reach 169.254.169.254: the link-local check proves nothing")
		}
	})
}

// TestContractBridge is egress on a bridge (embedded driver): the child's
// rules are a bridge table on its tap in the bridge's namespace, removed
// with the child.
func TestContractBridge(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	b := newBridgeNet(t)
	e := newEnv(t)
	b.inNamespace(t, e)
	for _, args := range [][]string{
		{"addr", "add", "169.254.169.254/32", "dev", b.bridge}, // a metadata address the parent reaches
	} {
		if out, err := exec.Command("ip", append([]string{"-n", b.ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	s := startNetServers(t, b.ns)
	name := "egress-" + b.ns + ".invalid"
	hostsEntry(t, b.gateway, name)
	dir := t.TempDir()
	none := filepath.Join(dir, "none.yaml")
	allow := filepath.Join(dir, "allow.yaml")
	os.WriteFile(none, []byte("network: {egress: none}\n"), 0o600)
	os.WriteFile(allow, []byte(fmt.Sprintf("network: {egress: {allow: [%s:%d]}}\n", name, s.tcp)), 0o600)

	e.boot("src", "--network", "bridge="+b.bridge)
	e.ok("fork", "src", "c-none", "--contract", none)
	e.ok("fork", "src", "c-allow", "--contract", allow)
	egressChecks(t, s, e.tryExec, "src", "c-none", "c-allow", b.gateway)
	tables := func() string {
		out, _ := exec.Command("ip", "netns", "exec", b.ns, "nft", "list", "tables").CombinedOutput()
		return string(out)
	}
	if ts := tables(); strings.Count(ts, "table bridge vmfork-c-") != 2 {
		t.Errorf("the children's bridge tables: %q, want one each", ts)
	}
	e.ok("rm", "c-none", "c-allow")
	if ts := tables(); strings.Contains(ts, "vmfork-c-") {
		t.Errorf("rm left the children's tables: %q", ts)
	}
}

// TestContractLibvirtNetwork is egress on an isolated libvirt network
// (libvirt driver): each child's interface gets a network filter of its
// own, which virsh lists, and which goes with the child.
func TestContractLibvirtNetwork(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	n := newLibvirtNet(t)
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	if out, err := exec.Command("ip", "addr", "add", "169.254.169.254/32", "dev", n.bridge).CombinedOutput(); err != nil {
		t.Fatalf("give the test network's bridge a metadata address: %v: %s", err, out)
	}
	s := startNetServers(t, "")
	name := "egress-" + n.name + ".invalid"
	hostsEntry(t, n.gateway, name)
	dir := t.TempDir()
	none := filepath.Join(dir, "none.yaml")
	allow := filepath.Join(dir, "allow.yaml")
	os.WriteFile(none, []byte("network: {egress: none}\n"), 0o600)
	os.WriteFile(allow, []byte(fmt.Sprintf("network: {egress: {allow: [%s:%d]}}\n", name, s.tcp)), 0o600)

	src := d.n("src")
	d.bootGuest(src, "--network", "network="+n.name)
	run := func(m string, argv ...string) (string, error) {
		r := d.cli(append([]string{"exec", m, "--"}, argv...)...)
		if r.code != 0 {
			return r.stdout, fmt.Errorf("%s", r)
		}
		return r.stdout, nil
	}
	// libvirt's dnsmasq gives an isolated network no default route: the
	// parent routes the metadata address through the bridge itself, and
	// its children inherit the route, so that their refusal is egress's.
	if out, err := run(src, "ip", "route", "add", "169.254.169.254/32", "via", n.gateway); err != nil {
		t.Fatalf("route the metadata address in %s: %v: %s", src, err, out)
	}
	d.cliOK("fork", src, d.n("none"), "--contract", none)
	d.cliOK("fork", src, d.n("allow"), "--contract", allow)
	egressChecks(t, s, run, src, d.n("none"), d.n("allow"), n.gateway)
	filters := virshOK(t, "nwfilter-list")
	for _, c := range []string{d.n("none"), d.n("allow")} {
		if !strings.Contains(filters, "vmfork-"+c) {
			t.Errorf("virsh nwfilter-list has no filter for %s:\n%s", c, filters)
		}
		if x := virshOK(t, "dumpxml", c); !strings.Contains(x, "filterref filter='vmfork-"+c+"'") {
			t.Errorf("%s's domain XML does not reference its filter", c)
		}
	}
	d.cliOK("rm", d.n("none"), d.n("allow"))
	if filters := virshOK(t, "nwfilter-list"); strings.Contains(filters, "vmfork-"+d.n("none")) || strings.Contains(filters, "vmfork-"+d.n("allow")) {
		t.Errorf("rm left the children's filters:\n%s", filters)
	}
}
