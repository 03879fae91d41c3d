//go:build integration

package tests

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmfork/vmfork/contract"
	"github.com/vmfork/vmfork/egress"
)

// Egress enforcement without a VM: network namespaces stand in for a
// bridge's machines, a veth port for a child's tap, and processes of this
// test binary (TestEgressHelperProcess) for the servers and clients. All
// traffic stays in namespaces the test makes (10.77.0.0/24, fd00:77::/64,
// and 169.254.169.254 only as an address of the test's own server
// namespace), or on the host's loopback to listeners the test runs.

// helperEnv names the job a re-executed test binary does.
const helperEnv = "VMFORK_EGRESS_HELPER"

// TestEgressHelperProcess is not a test: it is the servers and clients of
// the egress tests, run in their namespaces and cgroups.
//
//	serve tcp:ADDR udp:ADDR ...  echo a line (TCP) or a datagram (UDP) back;
//	                              prints "ready ADDR..." once listening
//	dial tcp|udp ADDR             exit 0 when the echo comes back within 1 s
//	wait dial tcp|udp ADDR        the same, after a line on stdin
func TestEgressHelperProcess(t *testing.T) {
	job := os.Getenv(helperEnv)
	if job == "" {
		return
	}
	args := strings.Fields(job)
	if args[0] == "wait" {
		bufio.NewReader(os.Stdin).ReadString('\n')
		args = args[1:]
	}
	switch args[0] {
	case "serve":
		helperServe(args[1:])
	case "dial":
		if err := helperDial(args[1], args[2]); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	fmt.Println("unknown job", job)
	os.Exit(2)
}

func helperServe(specs []string) {
	var bound []string
	for _, s := range specs {
		proto, addr, _ := strings.Cut(s, ":")
		switch proto {
		case "tcp":
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				fmt.Println(err)
				os.Exit(1)
			}
			bound = append(bound, "tcp:"+ln.Addr().String())
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						c.SetDeadline(time.Now().Add(5 * time.Second))
						line, _ := bufio.NewReader(c).ReadString('\n')
						c.Write([]byte(line))
					}()
				}
			}()
		case "udp":
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				fmt.Println(err)
				os.Exit(1)
			}
			bound = append(bound, "udp:"+pc.LocalAddr().String())
			go func() {
				buf := make([]byte, 1500)
				for {
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					pc.WriteTo(buf[:n], from)
				}
			}()
		}
	}
	fmt.Println("ready", strings.Join(bound, " "))
	select {}
}

func helperDial(proto, addr string) error {
	c, err := net.DialTimeout(proto, addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if string(buf[:n]) != "ping\n" {
		return fmt.Errorf("echo %q, want ping", buf[:n])
	}
	return nil
}

// helper is a command that runs this test binary as job; mod changes it
// (its namespace, its cgroup) before it starts.
func helper(t *testing.T, job string, argv0 ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := append(argv0, exe, "-test.run=^TestEgressHelperProcess$")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), helperEnv+"="+job)
	return cmd
}

// startServer starts a serve job and returns the addresses it bound,
// and stops it when the test ends.
func startServer(t *testing.T, cmd *exec.Cmd) []string {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "ready" {
			t.Fatalf("server %v: %q", cmd.Args, l)
		}
		return f[1:]
	case <-time.After(20 * time.Second):
		t.Fatalf("server %v: not ready after 20s", cmd.Args)
	}
	return nil
}

// reach runs a dial job: nil when the echo came back.
func reach(cmd *exec.Cmd) error {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// probe is one reachability expectation.
type probe struct {
	ns, proto, addr string
	want            bool
}

// expectAll runs the probes at once (a blocked one waits out its 1 s) and
// reports each that did not come out as wanted.
func expectAll(t *testing.T, step string, probes ...probe) {
	t.Helper()
	errs := make([]error, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = reach(helper(t, "dial "+p.proto+" "+p.addr, "ip", "netns", "exec", p.ns))
		}()
	}
	wg.Wait()
	for i, p := range probes {
		if got := errs[i] == nil; got != p.want {
			t.Errorf("%s: %s %s from %s: reached %v, want %v (%v)", step, p.proto, p.addr, p.ns, got, p.want, errs[i])
		}
	}
}

// egressLab is a bridge in a namespace of its own (sw) with three
// machines on it, each a namespace: cli (the child whose port gets the
// rules), cli2 (another machine, unrestricted) and srv (servers).
type egressLab struct {
	sw, cli, cli2, srv string
	port               string // cli's port on the bridge: the "tap"
	host               egress.Host
}

func newEgressLab(t *testing.T) *egressLab {
	t.Helper()
	sum := sha256.Sum256([]byte(t.Name() + t.TempDir()))
	id := hex.EncodeToString(sum[:3])
	l := &egressLab{sw: "vmfe-" + id + "-sw", cli: "vmfe-" + id + "-cli", cli2: "vmfe-" + id + "-cli2", srv: "vmfe-" + id + "-srv", port: "vfc" + id}
	l.host = egress.Host{NetNS: "/run/netns/" + l.sw}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{l.sw, l.cli, l.cli2, l.srv} {
		run("ip", "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("remove namespace %s: %v: %s", ns, err, out)
			}
		})
		run("ip", "-n", ns, "link", "set", "lo", "up")
	}
	run("ip", "-n", l.sw, "link", "add", "br0", "type", "bridge")
	run("ip", "-n", l.sw, "link", "set", "br0", "up")
	for _, m := range []struct {
		ns, port string
		addrs    []string
	}{
		{l.cli, l.port, []string{"10.77.0.2/24", "fd00:77::2/64"}},
		{l.cli2, "vfu" + id, []string{"10.77.0.3/24", "fd00:77::3/64"}},
		{l.srv, "vfs" + id, []string{"10.77.0.10/24", "10.77.0.11/24", "169.254.169.254/32", "fd00:77::10/64"}},
	} {
		run("ip", "-n", l.sw, "link", "add", m.port, "type", "veth", "peer", "name", "eth0", "netns", m.ns)
		run("ip", "-n", l.sw, "link", "set", m.port, "master", "br0", "up")
		for _, a := range m.addrs {
			args := []string{"ip", "-n", m.ns, "addr", "add", a, "dev", "eth0"}
			if strings.Contains(a, ":") {
				args = append(args, "nodad") // no 1 s wait for duplicate detection
			}
			run(args...)
		}
		run("ip", "-n", m.ns, "link", "set", "eth0", "up")
	}
	// The metadata address is on srv's link: the clients reach it there
	// and nowhere else.
	for _, ns := range []string{l.cli, l.cli2} {
		run("ip", "-n", ns, "route", "add", "169.254.169.254/32", "dev", "eth0")
	}
	return l
}

// serverResolver is the host's resolver in this test: it knows the
// servers' names, whatever a guest would answer.
type serverResolver map[string]string

func (r serverResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	a, ok := r[host]
	if !ok {
		return nil, fmt.Errorf("lookup %s: no such host", host)
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}

func compileNet(t *testing.T, spec string) egress.Rules {
	t.Helper()
	c, err := contract.ParseYAML([]byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	r, err := egress.Compile(t.Context(), *c.Network, serverResolver{"server.test": "10.77.0.11"})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestEgressBridgeNetns: rules on a child's bridge port block and pass
// exactly what its contract says, leave the other machines on the bridge
// alone, let connections made to the child work, and go with Remove.
func TestEgressBridgeNetns(t *testing.T) {
	l := newEgressLab(t)
	startServer(t, helper(t, "serve tcp:10.77.0.10:8001 udp:10.77.0.10:8001 tcp:10.77.0.10:8002 udp:10.77.0.10:8002 "+
		"tcp:10.77.0.11:8001 tcp:10.77.0.11:8002 udp:10.77.0.11:8002 tcp:169.254.169.254:80 udp:10.77.0.10:53 "+
		"tcp:[fd00:77::10]:8001 tcp:[fd00:77::10]:8002", "ip", "netns", "exec", l.srv))
	startServer(t, helper(t, "serve tcp:10.77.0.2:9000 udp:10.77.0.2:9000", "ip", "netns", "exec", l.cli))
	const machine = "child-1"
	t.Cleanup(func() { l.host.Remove(machine) })

	expectAll(t, "no rules",
		probe{l.cli, "tcp", "10.77.0.10:8001", true},
		probe{l.cli, "udp", "10.77.0.10:8002", true},
		probe{l.cli, "tcp", "169.254.169.254:80", true},
		probe{l.cli, "tcp", "[fd00:77::10]:8002", true},
	)

	dns := []netip.Addr{netip.MustParseAddr("10.77.0.10")}
	if err := l.host.ApplyBridge(machine, egress.Bridge{Tap: l.port, DNS: dns}, compileNet(t, "network: {egress: none, dns: host}")); err != nil {
		t.Fatal(err)
	}
	expectAll(t, "egress none",
		probe{l.cli, "tcp", "10.77.0.10:8001", false},
		probe{l.cli, "udp", "10.77.0.10:8001", false},
		probe{l.cli, "tcp", "10.77.0.11:8002", false},
		probe{l.cli, "tcp", "169.254.169.254:80", false},
		probe{l.cli, "tcp", "[fd00:77::10]:8001", false},
		probe{l.cli, "udp", "10.77.0.10:53", true}, // dns: host
		// The other machine on the bridge is unaffected.
		probe{l.cli2, "tcp", "10.77.0.10:8001", true},
		probe{l.cli2, "udp", "10.77.0.10:8001", true},
		probe{l.cli2, "tcp", "169.254.169.254:80", true},
		// Connections made to the child get their replies.
		probe{l.srv, "tcp", "10.77.0.2:9000", true},
		probe{l.srv, "udp", "10.77.0.2:9000", true},
		probe{l.cli2, "tcp", "10.77.0.2:9000", true},
	)
	lines, err := l.host.List(machine)
	if err != nil {
		t.Fatal(err)
	}
	if !hasCount(lines, "drop everything else (egress: none)") {
		t.Errorf("no drops counted in:\n%s", strings.Join(lines, "\n"))
	}

	// Replaced in place: by address, by a name the host resolves, and an
	// IPv6 address (whose neighbour discovery must pass).
	allow := `network:
  egress: {allow: ["10.77.0.10:8001", "server.test:8002", "[fd00:77::10]:8001"]}
  dns: none
`
	if err := l.host.ApplyBridge(machine, egress.Bridge{Tap: l.port, DNS: dns}, compileNet(t, allow)); err != nil {
		t.Fatal(err)
	}
	// Forget the neighbours learnt before the rules, so that IPv6 works
	// only if neighbour discovery passes them.
	for _, ns := range []string{l.cli, l.srv} {
		if out, err := exec.Command("ip", "-n", ns, "neigh", "flush", "all").CombinedOutput(); err != nil {
			t.Fatalf("ip -n %s neigh flush all: %v: %s", ns, err, out)
		}
	}
	expectAll(t, "egress allow",
		probe{l.cli, "tcp", "10.77.0.10:8001", true},
		probe{l.cli, "udp", "10.77.0.10:8001", true},
		probe{l.cli, "tcp", "10.77.0.11:8002", true}, // server.test
		probe{l.cli, "udp", "10.77.0.11:8002", true},
		probe{l.cli, "tcp", "[fd00:77::10]:8001", true},
		probe{l.cli, "tcp", "10.77.0.10:8002", false},
		probe{l.cli, "udp", "10.77.0.10:8002", false},
		probe{l.cli, "tcp", "10.77.0.11:8001", false},
		probe{l.cli, "tcp", "[fd00:77::10]:8002", false},
		probe{l.cli, "tcp", "169.254.169.254:80", false},
		probe{l.cli, "udp", "10.77.0.10:53", false}, // dns: none
		probe{l.srv, "tcp", "10.77.0.2:9000", true},
		probe{l.cli2, "tcp", "10.77.0.10:8002", true},
	)
	lines, err = l.host.List(machine)
	if err != nil {
		t.Fatal(err)
	}
	if !hasLine(lines, "accept tcp+udp 10.77.0.11 port 8002 (allow server.test:8002)") {
		t.Errorf("List does not show the resolved name:\n%s", strings.Join(lines, "\n"))
	}

	if err := l.host.Remove(machine); err != nil {
		t.Fatal(err)
	}
	if err := l.host.Remove(machine); err != nil {
		t.Errorf("Remove again: %v", err)
	}
	expectAll(t, "removed",
		probe{l.cli, "tcp", "10.77.0.10:8002", true},
		probe{l.cli, "udp", "10.77.0.10:8002", true},
		probe{l.cli, "tcp", "169.254.169.254:80", true},
	)
}

func hasLine(lines []string, s string) bool {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// hasCount reports whether the rule with comment s counted a packet.
func hasCount(lines []string, s string) bool {
	re := regexp.MustCompile(regexp.QuoteMeta(s) + ` \[(\d+) packets\]`)
	for _, l := range lines {
		if m := re.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n > 0
		}
	}
	return false
}

// TestEgressCgroup: on the host, the user-mode rules (socket cgroupv2)
// stop a process in the machine's cgroup and nothing else. cgroup2 sits
// beside v1 controllers on this project's test host, where a mismatch
// would make the rules match nothing, silently: the test shows them
// matching.
func TestEgressCgroup(t *testing.T) {
	mount, err := egress.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cgroup2 at %s", mount)
	machine := fmt.Sprintf("egress-it-%d", os.Getpid())
	host := egress.Host{}
	cg, err := egress.CreateCgroup(machine)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := egress.RemoveCgroup(machine); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() {
		if err := host.Remove(machine); err != nil {
			t.Error(err)
		}
	})
	tcp := startServer(t, helper(t, "serve tcp:127.0.0.1:0 udp:127.0.0.1:0"))
	tcpAddr, udpAddr := strings.TrimPrefix(tcp[0], "tcp:"), strings.TrimPrefix(tcp[1], "udp:")
	resolvers, err := egress.ResolvConf("/etc/resolv.conf")
	if err != nil {
		t.Fatal(err)
	}
	u := egress.User{Cgroup: cg, Resolvers: resolvers}
	if err := host.ApplyUser(machine, u, compileNet(t, "network: {egress: none}")); err != nil {
		t.Fatal(err)
	}

	dir, err := os.Open(cg.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	// Born in the cgroup (clone3 CLONE_INTO_CGROUP), as a driver starts
	// QEMU.
	inCgroup := func(job string) *exec.Cmd {
		cmd := helper(t, job)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
		return cmd
	}
	check := func(step string, cmd *exec.Cmd, want bool) {
		t.Helper()
		err := reach(cmd)
		if got := err == nil; got != want {
			t.Errorf("%s: reached %v, want %v (%v)", step, got, want, err)
		}
	}
	check("tcp in the cgroup", inCgroup("dial tcp "+tcpAddr), false)
	check("udp in the cgroup", inCgroup("dial udp "+udpAddr), false)
	check("tcp outside", helper(t, "dial tcp "+tcpAddr), true)
	check("udp outside", helper(t, "dial udp "+udpAddr), true)

	// Moved in while running (Cgroup.Add), before it makes its socket.
	moved := helper(t, "wait dial tcp "+tcpAddr)
	stdin, err := moved.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := moved.Start(); err != nil {
		t.Fatal(err)
	}
	if err := cg.Add(moved.Process.Pid); err != nil {
		moved.Process.Kill()
		moved.Wait()
		t.Fatal(err)
	}
	stdin.Write([]byte("go\n"))
	if err := moved.Wait(); err == nil {
		t.Error("a process moved into the cgroup reached the server")
	}

	// A server in the cgroup answers connections made to it.
	served := startServer(t, inCgroup("serve tcp:127.0.0.1:0"))
	if err := helperDial("tcp", strings.TrimPrefix(served[0], "tcp:")); err != nil {
		t.Errorf("a connection to a server in the cgroup: %v", err)
	}

	// Allowed in place: exactly the listed port.
	if err := host.ApplyUser(machine, u, compileNet(t, "network: {egress: {allow: ["+tcpAddr+"]}}")); err != nil {
		t.Fatal(err)
	}
	check("allowed tcp in the cgroup", inCgroup("dial tcp "+tcpAddr), true)
	check("udp, not allowed, in the cgroup", inCgroup("dial udp "+udpAddr), false)
	lines, err := host.List(machine)
	if err != nil {
		t.Fatal(err)
	}
	if !hasCount(lines, "drop everything else (egress: allow)") {
		t.Errorf("no drops counted in:\n%s", strings.Join(lines, "\n"))
	}
	if err := host.Remove(machine); err != nil {
		t.Fatal(err)
	}
	check("udp in the cgroup, rules removed", inCgroup("dial udp "+udpAddr), true)
}
