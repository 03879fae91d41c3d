//go:build integration

package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Children on real shared networks: a bridge with a DHCP server, for the
// embedded driver, and an isolated libvirt network with its own dnsmasq,
// for the libvirt driver. The test networks stay on this machine: the
// bridge lives in a network namespace the test makes, the libvirt network
// has no <forward>, and the only traffic is DHCP and a few bounded pings
// among the test's own guests.

// bridgeNet is a bridge with a DHCP server in a network namespace of its own.
type bridgeNet struct {
	ns, bridge string
	gateway    string // the bridge's own address, the DHCP server's
	leases     string // dnsmasq's lease file
	dir        string // the lease file's and dnsmasq's log's
	dnsmasq    *exec.Cmd
}

// newBridgeNet makes namespace, bridge and dnsmasq, and removes them when the
// test ends, pass or fail. Call it before newEnv, so that the env's cleanup
// (which kills the test's QEMU processes, inside the namespace) runs first.
func newBridgeNet(t testing.TB) *bridgeNet {
	t.Helper()
	sum := sha256.Sum256([]byte(t.Name() + t.TempDir()))
	id := hex.EncodeToString(sum[:3])
	dir := t.TempDir()
	b := &bridgeNet{ns: "vmfork-" + id, bridge: "vmfbr" + id, gateway: "10.231.0.1", leases: filepath.Join(dir, "leases")}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "netns", "add", b.ns)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", b.ns).CombinedOutput(); err != nil {
			t.Errorf("remove namespace %s: %v: %s", b.ns, err, out)
		}
	})
	run("ip", "-n", b.ns, "link", "set", "lo", "up")
	run("ip", "-n", b.ns, "link", "add", b.bridge, "type", "bridge")
	run("ip", "-n", b.ns, "addr", "add", b.gateway+"/24", "dev", b.bridge)
	run("ip", "-n", b.ns, "link", "set", b.bridge, "up")
	b.dir = dir
	b.startDNSMasq(t, false)
	t.Cleanup(func() {
		b.stopDNSMasq()
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "dnsmasq.log"))
			t.Logf("dnsmasq log:\n%s", tail(string(log), 40))
		}
	})
	return b
}

// startDNSMasq starts b's DHCP server. With ping false it runs with
// --no-ping, as vmfork's docs tell users to (README, "Children on shared
// networks"): by default dnsmasq pings each address it is about to offer
// and waits 3 s for no answer, one address after another, which is a test
// of the DHCP server's patience, not of the network (BenchmarkNetworkChain
// measures both).
func (b *bridgeNet) startDNSMasq(t testing.TB, ping bool) {
	t.Helper()
	args := []string{"netns", "exec", b.ns, "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null",
		"--user=root", "--port=0", "--bind-interfaces", "--interface=" + b.bridge, "--except-interface=lo",
		"--dhcp-range=10.231.0.10,10.231.0.250,1h", "--dhcp-leasefile=" + b.leases,
		"--log-dhcp", "--log-facility=" + filepath.Join(b.dir, "dnsmasq.log")}
	if !ping {
		args = append(args, "--no-ping")
	}
	b.dnsmasq = exec.Command("ip", args...)
	if err := b.dnsmasq.Start(); err != nil {
		t.Fatalf("start dnsmasq: %v", err)
	}
}

// stopDNSMasq stops b's DHCP server, if it runs; its leases stay in the
// lease file for the next one. ip netns exec execs dnsmasq: the PID is
// dnsmasq's.
func (b *bridgeNet) stopDNSMasq() {
	cmd := b.dnsmasq
	if cmd == nil {
		return
	}
	b.dnsmasq = nil
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// setSTP switches STP on b's bridge on, with the forward delay libvirt's
// default network has (stp='on' delay='0', which the kernel makes its least
// with STP on, 2 s), or off.
func (b *bridgeNet) setSTP(t testing.TB, on bool) {
	t.Helper()
	args := []string{"-n", b.ns, "link", "set", b.bridge, "type", "bridge", "stp_state", "0"}
	if on {
		args = []string{"-n", b.ns, "link", "set", b.bridge, "type", "bridge", "forward_delay", "200", "stp_state", "1"}
	}
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// inNamespace makes e run vmfork inside b's namespace, so that QEMU's taps
// and the bridge share it.
func (b *bridgeNet) inNamespace(t testing.TB, e *env) {
	t.Helper()
	w := filepath.Join(t.TempDir(), "vmfork-in-"+b.ns)
	script := fmt.Sprintf("#!/bin/sh\nexec ip netns exec %s %s \"$@\"\n", b.ns, e.bin)
	if err := os.WriteFile(w, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	e.bin = w
}

// lease is one DHCP lease.
type lease struct{ mac, ip string }

// dnsmasqLeases reads dnsmasq's lease file: "expiry MAC IP hostname
// client-id" per line.
func (b *bridgeNet) dnsmasqLeases(t *testing.T) []lease {
	t.Helper()
	data, err := os.ReadFile(b.leases)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var ls []lease
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 3 {
			ls = append(ls, lease{mac: strings.ToLower(f[1]), ip: f[2]})
		}
	}
	return ls
}

// tapsOn lists the interfaces plugged into b's bridge.
func (b *bridgeNet) tapsOn(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "-n", b.ns, "-o", "link", "show", "master", b.bridge).Output()
	if err != nil {
		t.Fatalf("ip link show master %s: %v", b.bridge, err)
	}
	var taps []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			taps = append(taps, strings.TrimSuffix(f[1], ":"))
		}
	}
	return taps
}

// TestNetworkBridgeChildren forks a source on a bridge with a DHCP server
// into three children: each has a tap of its own on the bridge, a lease of
// its own (none the parent's) and reaches the parent over the bridge; the
// taps go with their machines. A missing bridge or one that is not a bridge
// is refused before anything starts or pauses.
func TestNetworkBridgeChildren(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	b := newBridgeNet(t)
	e := newEnv(t)
	b.inNamespace(t, e)

	for _, c := range []struct{ network, says string }{
		{"bridge=vmfnobr0", `bridge "vmfnobr0" does not exist`},
		{"bridge=lo", `interface "lo" is not a bridge`},
		{"bridge=" + b.bridge + ",x", "not a valid interface"},
	} {
		r := e.vmfork("boot", "bad", "--kernel", e.guest.Kernel, "--initrd", e.guest.Initrd, "--network", c.network)
		if r.code != 2 || !strings.Contains(r.stderr, c.says) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("boot --network %s: %s; want exit 2 and one line saying %q", c.network, r, c.says)
		}
	}
	if ms := e.list(); len(ms) != 0 {
		t.Fatalf("refused boots left machines: %+v", ms)
	}

	src := e.boot("src", "--network", "bridge="+b.bridge)
	if got := e.networkOf("src"); got != "bridge="+b.bridge {
		t.Errorf("ls --json: src's network is %q, want bridge=%s", got, b.bridge)
	}
	parentIP := b.leaseOf(t, src.MAC)
	if parentIP == "" {
		t.Fatalf("the source got no lease on the bridge: leases %+v", b.dnsmasqLeases(t))
	}

	// What the children and the pool member below put on the bridge: none
	// of it may announce the source (its MAC, its address), nor be a RARP
	// frame (QEMU's announcement after a load of the device state, which
	// must go nowhere, qemudrv.Driver.Complete).
	sn := sniffNamespace(t, b.ns)
	ports, srcIf := b.ifindexes(t), 0
	if len(ports) != 1 {
		t.Fatalf("ports on %s before the fork: %v, want the source's only", b.bridge, ports)
	}
	for _, i := range ports {
		srcIf = i
	}

	kids := forkOnBridge(t, e, b, src, parentIP)
	sn.checkNoLeak(t, b.ifindexes(t), srcIf, src.MAC, parentIP)

	// A child's NIC is configured with its own MAC, not its source's (the
	// guest's MAC comes from the device state): a reset keeps it, and with
	// it the child's own lease.
	for _, k := range kids {
		if got, want := e.nicConfiguredMAC(k), e.machine(k).MAC; got != want {
			t.Errorf("%s's NIC is configured with %s, want its own %s (the source's is %s)", k, got, want, src.MAC)
		}
	}

	e.ok(append([]string{"rm", "--force"}, kids...)...)
	if !eventually(30*time.Second, func() bool { return len(b.tapsOn(t)) == 1 }) {
		t.Errorf("taps on %s after the children went: %v, want the source's only", b.bridge, b.tapsOn(t))
	}

	// A kept template's warm pool: its members wait with taps of their own
	// on the bridge, and a child taken from the pool is on it like any.
	e.ok("template", "save", "src", "golden", "--pool", "1")
	if !eventually(time.Minute, func() bool { return len(b.tapsOn(t)) == 2 }) {
		t.Errorf("taps on %s with one pool member: %v, want the source's and the member's", b.bridge, b.tapsOn(t))
	}
	res, r := e.forkID(0, "golden", "pooled")
	if len(res.Children) != 1 {
		t.Fatalf("fork of the kept template: %s", r)
	}
	m := e.machine("pooled")
	sn.checkNoLeak(t, b.ifindexes(t), srcIf, src.MAC, parentIP)
	if ip := b.leaseOf(t, m.MAC); ip == "" || ip == parentIP {
		t.Errorf("the pooled child (%s) has lease %q: want one of its own (the parent's is %s)", m.MAC, ip, parentIP)
	} else if out, err := e.tryExec("pooled", "ping", "-c", "2", "-W", "2", parentIP); err != nil {
		t.Errorf("the pooled child cannot ping the parent at %s: %v: %s", parentIP, err, out)
	}
	e.ok("rm", "--force", "pooled")
	e.ok("template", "rm", "golden")
	if !eventually(time.Minute, func() bool { return len(b.tapsOn(t)) == 1 }) {
		t.Errorf("taps on %s after the template and its pool went: %v, want the source's only", b.bridge, b.tapsOn(t))
	}

	// A bridge gone since the source booted fails the fork before the
	// pause: nothing is made and the source runs on.
	if out, err := exec.Command("ip", "-n", b.ns, "link", "del", b.bridge).CombinedOutput(); err != nil {
		t.Fatalf("remove the bridge: %v: %s", err, out)
	}
	r = e.vmfork("fork", "src")
	if r.code != 2 || !strings.Contains(r.stderr, b.bridge) {
		t.Errorf("fork of a source whose bridge is gone: %s, want exit 2 naming %s", r, b.bridge)
	}
	if ms := e.list(); len(ms) != 1 || ms[0].State != "running" {
		t.Errorf("after the refused fork: %+v, want the source alone, running", ms)
	}
	if _, err := e.tryExec("src", "true"); err != nil {
		t.Errorf("the source does not run commands after the refused fork: %v", err)
	}
}

// TestNetworkNone boots a machine whose NIC has nothing behind it: QEMU gets
// no -netdev, and its children keep their address instead of asking for a
// lease nobody would give.
func TestNetworkNone(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	src := e.boot("src", "--network", "none")
	if got := e.networkOf("src"); got != "none" {
		t.Errorf("ls --json: network %q, want none", got)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", src.PID))
	if err != nil || strings.Contains(string(cmdline), "-netdev") || !strings.Contains(string(cmdline), "virtio-net-pci") {
		t.Errorf("QEMU's command line (%v): want a virtio NIC and no -netdev:\n%q", err, cmdline)
	}
	res, r := e.forkID(0, "src")
	if len(res.Children) != 1 || res.Children[0].Identity == nil {
		t.Fatalf("fork: %s", r)
	}
	c := res.Children[0]
	if st := c.Identity.step("vmfork.network"); st.Status != "ok" {
		t.Errorf("%s's network step: %+v, want ok (only a new MAC)", c.Name, st)
	}
	if got := e.networkOf(c.Name); got != "none" {
		t.Errorf("%s's network is %q, want its source's none", c.Name, got)
	}
}

// forkOnBridge forks src, booted on b with address parentIP, into three
// children and checks that each is on b with a tap, a MAC and a lease of its
// own, none the parent's, that its NIC has that one IPv4 address, and that it
// pings the parent. It returns the children's names.
func forkOnBridge(t *testing.T, e *env, b *bridgeNet, src machineJSON, parentIP string) []string {
	t.Helper()
	res, r := e.forkID(0, src.Name, "--count", "3")
	if len(res.Children) != 3 {
		t.Fatalf("fork: %+v (%s), want three children", res, r)
	}
	if taps := b.tapsOn(t); len(taps) != 4 {
		t.Errorf("taps on %s: %v, want one each for the source and its three children", b.bridge, taps)
	}
	ips := map[string]string{parentIP: src.Name}
	for _, c := range res.Children {
		m := e.machine(c.Name)
		if got := e.networkOf(c.Name); got != "bridge="+b.bridge {
			t.Errorf("%s's network is %q, want its source's bridge=%s", c.Name, got, b.bridge)
		}
		if m.MAC == "" || m.MAC == src.MAC {
			t.Errorf("%s's MAC %q: want one of its own, not the source's %s", c.Name, m.MAC, src.MAC)
		}
		ip := b.leaseOf(t, m.MAC)
		if ip == "" {
			t.Errorf("%s (%s) has no lease: %+v", c.Name, m.MAC, b.dnsmasqLeases(t))
			continue
		}
		if other, dup := ips[ip]; dup {
			t.Errorf("%s's lease %s is %s's too", c.Name, ip, other)
		}
		ips[ip] = c.Name
		got := guestIPv4(e.exec(c.Name, "ip", "-4", "-o", "addr", "show", "dev", "eth0"))
		if len(got) != 1 || got[0] != ip {
			t.Errorf("%s's eth0 has %v: want its lease %s alone (not the parent's %s)", c.Name, got, ip, parentIP)
		}
		if out, err := e.tryExec(c.Name, "ping", "-c", "2", "-W", "2", parentIP); err != nil {
			t.Errorf("%s cannot ping the parent at %s over the bridge: %v: %s", c.Name, parentIP, err, out)
		}
	}
	var kids []string
	for _, c := range res.Children {
		kids = append(kids, c.Name)
	}
	return kids
}

// nicConfiguredMAC returns the MAC machine name's QEMU NIC is configured
// with, the one the guest gets after a reset.
func (e *env) nicConfiguredMAC(name string) string {
	e.t.Helper()
	var mac string
	e.qmpCall(name, "qom-get", map[string]string{"path": "/machine/peripheral/nic0", "property": "mac"}, &mac)
	return mac
}

// leaseOf returns the address dnsmasq leased to mac, or "".
func (b *bridgeNet) leaseOf(t *testing.T, mac string) string {
	t.Helper()
	for _, l := range b.dnsmasqLeases(t) {
		if l.mac == strings.ToLower(mac) {
			return l.ip
		}
	}
	return ""
}

// networkOf returns machine name's network as `ls --json` shows it, in the
// form --network takes.
func (e *env) networkOf(name string) string {
	e.t.Helper()
	return networkIn(e.t, e.ok("ls", "--json").stdout, name)
}

// networkOf is env.networkOf through the driver's flags.
func (d *driverEnv) networkOf(name string) string {
	d.t.Helper()
	return networkIn(d.t, d.cliOK("ls", "--json").stdout, name)
}

func networkIn(t testing.TB, lsJSON, name string) string {
	t.Helper()
	var ms []struct {
		Name    string `json:"name"`
		Network struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"network"`
	}
	if err := jsonDecode(lsJSON, &ms); err != nil {
		t.Fatalf("ls --json: %v", err)
	}
	for _, m := range ms {
		if m.Name == name {
			if m.Network.Name != "" {
				return m.Network.Kind + "=" + m.Network.Name
			}
			return m.Network.Kind
		}
	}
	t.Fatalf("ls does not list %s", name)
	return ""
}

// tryExec runs argv in machine name and returns its stdout, or an error
// carrying the run when it does not exit 0.
func (e *env) tryExec(name string, argv ...string) (string, error) {
	e.t.Helper()
	r := e.vmfork(append([]string{"exec", name, "--"}, argv...)...)
	if r.code != 0 {
		return r.stdout, fmt.Errorf("%s", r)
	}
	return r.stdout, nil
}

// guestIPv4 returns the IPv4 addresses (without prefix) in `ip -4 -o addr`
// output.
func guestIPv4(out string) []string {
	var ips []string
	for _, f := range strings.Fields(out) {
		if p, err := netip.ParsePrefix(f); err == nil && p.Addr().Is4() {
			ips = append(ips, p.Addr().String())
		}
	}
	return ips
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// libvirtNet is an isolated libvirt network (no <forward>: nothing leaves
// it) with libvirt's dnsmasq handing out leases.
type libvirtNet struct{ name, bridge, gateway string }

// libvirtNets counts the libvirt networks this test binary made: each gets
// a subnet of its own (10.232.N.0/24), since they all live in the host's
// network namespace and tests that make them run in parallel.
var libvirtNets atomic.Int32

// newLibvirtNet creates a transient isolated network and destroys it when
// the test ends, pass or fail. Call it before newDriverEnv, so that the
// test's domains go first.
func newLibvirtNet(t testing.TB) *libvirtNet {
	t.Helper()
	sum := sha256.Sum256([]byte(t.Name() + t.TempDir()))
	id := hex.EncodeToString(sum[:3])
	subnet := fmt.Sprintf("10.232.%d.", libvirtNets.Add(1)%250)
	n := &libvirtNet{name: "vmfork-" + id, bridge: "vmfvb" + id, gateway: subnet + "1"}
	x := `<network>
  <name>` + n.name + `</name>
  <bridge name='` + n.bridge + `' stp='off'/>
  <ip address='` + n.gateway + `' netmask='255.255.255.0'>
    <dhcp><range start='` + subnet + `10' end='` + subnet + `250'/></dhcp>
  </ip>
</network>
`
	f := filepath.Join(t.TempDir(), n.name+".xml")
	if err := os.WriteFile(f, []byte(x), 0o644); err != nil {
		t.Fatal(err)
	}
	virshOK(t, "net-create", f)
	t.Cleanup(func() {
		if out, err := virsh(t, "net-destroy", n.name); err != nil {
			t.Errorf("virsh net-destroy %s: %v: %s", n.name, err, out)
		}
	})
	return n
}

// leases lists `virsh net-dhcp-leases`: one line per lease, the MAC and
// the address among its fields.
func (n *libvirtNet) leases(t *testing.T) []lease {
	t.Helper()
	var ls []lease
	for _, l := range strings.Split(virshOK(t, "net-dhcp-leases", n.name), "\n") {
		var le lease
		for _, f := range strings.Fields(l) {
			if len(f) == 17 && strings.Count(f, ":") == 5 {
				le.mac = strings.ToLower(f)
			} else if p, err := netip.ParsePrefix(f); err == nil && p.Addr().Is4() {
				le.ip = p.Addr().String()
			}
		}
		if le.mac != "" && le.ip != "" {
			ls = append(ls, le)
		}
	}
	return ls
}

func (n *libvirtNet) leasesOf(t *testing.T, mac string) []string {
	t.Helper()
	var ips []string
	for _, l := range n.leases(t) {
		if l.mac == strings.ToLower(mac) {
			ips = append(ips, l.ip)
		}
	}
	return ips
}

// TestNetworkLibvirtChildren forks a domain an operator put on an isolated
// libvirt network, through <interface type='network'> and through
// type='bridge' on that network's bridge, into three children: they are on
// the same network, each under its own MAC with one lease of its own from
// the network's dnsmasq (none the parent's), and each reaches the parent.
func TestNetworkLibvirtChildren(t *testing.T) {
	parallelParent(t) // heavy and self-contained (tests/doc.go, "Parallel")
	for _, kind := range []string{"network", "bridge"} {
		t.Run(kind, func(t *testing.T) {
			parallel(t) // a network (and subnet) of its own
			n := newLibvirtNet(t)
			name := n.name
			if kind == "bridge" {
				name = n.bridge
			}
			nic := "<interface type='" + kind + "'><source " + kind + "='" + name + "'/>"
			forkOnLibvirtNet(t, n, nic, kind+"="+name)
		})
	}
}

// forkOnLibvirtNet defines and starts a domain whose NIC is nic (an opening
// <interface> tag and its <source>), on n, which ls shows as network, forks
// it into three and checks the children.
func forkOnLibvirtNet(t *testing.T, n *libvirtNet, nic, network string) {
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	// The domain's QEMU runs as libvirt-qemu, as an operator's would.
	reachableByQEMU(t, filepath.Dir(t.TempDir()))
	p := d.n("net")
	x := strings.Replace(operatorXML(p, d.guest, "", sharedFileRAM, noBalloon), "<interface type='user'>", nic, 1)
	defineDomain(t, p, x, true)
	waitAgent(t, p)
	parentMAC := ""
	for _, f := range strings.Fields(virshOK(t, "domiflist", p)) {
		if len(f) == 17 && strings.Count(f, ":") == 5 {
			parentMAC = strings.ToLower(f)
		}
	}
	var parentIP string
	if !eventually(time.Minute, func() bool {
		ips := n.leasesOf(t, parentMAC)
		if len(ips) == 1 {
			parentIP = ips[0]
		}
		return parentIP != ""
	}) {
		t.Fatalf("the parent (%s) got no lease on %s: %+v", parentMAC, n.name, n.leases(t))
	}

	// All three at once, as users fork. libvirt's dnsmasq pings every
	// address before it offers it (3 s, one offer after another), so the
	// children's DHCP clients must be patient enough for that.
	var res forkJSON
	d.cliJSON(&res, "fork", p, "--count", "3")
	if len(res.Children) != 3 || len(res.Failed) != 0 {
		t.Fatalf("fork = %+v, want three children", res)
	}
	ms := d.machines()
	if got := d.networkOf(p); got != network {
		t.Errorf("ls --json: %s's network is %q, want %s", p, got, network)
	}
	ips := map[string]string{parentIP: p}
	for _, c := range res.Children {
		mac := strings.ToLower(ms[c.Name].MAC)
		if mac == "" || mac == parentMAC {
			t.Errorf("%s's MAC %q: want one of its own, not the parent's %s", c.Name, mac, parentMAC)
		}
		if got := strings.ToLower(virshOK(t, "domiflist", c.Name)); !strings.Contains(got, strings.SplitN(network, "=", 2)[1]) || !strings.Contains(got, mac) {
			t.Errorf("virsh domiflist %s:\n%s\nwant %s and the child's MAC %s", c.Name, got, network, mac)
		}
		if got := d.networkOf(c.Name); got != network {
			t.Errorf("ls --json: %s's network is %q, want its source's %s", c.Name, got, network)
		}
		got := n.leasesOf(t, mac)
		if len(got) != 1 {
			t.Errorf("virsh net-dhcp-leases %s lists %v for %s (%s), want one lease", n.name, got, c.Name, mac)
			continue
		}
		if other, dup := ips[got[0]]; dup {
			t.Errorf("%s's lease %s is %s's too", c.Name, got[0], other)
		}
		ips[got[0]] = c.Name
		addrs := guestIPv4(d.run(c.Name, "ip", "-4", "-o", "addr", "show", "dev", "eth0"))
		if !contains(addrs, got[0]) || contains(addrs, parentIP) {
			t.Errorf("%s's eth0 has %v: want its lease %s and not the parent's %s", c.Name, addrs, got[0], parentIP)
		}
		if r := d.cli("exec", c.Name, "--", "ping", "-c", "2", "-W", "2", parentIP); r.code != 0 {
			t.Errorf("%s cannot ping the parent at %s over %s: %s", c.Name, parentIP, n.name, r)
		}
	}
}

// TestNetworkLibvirtBoot boots a machine of the libvirt driver on an
// isolated libvirt network, and refuses, with nothing made, a network that
// does not exist and a NIC with nothing behind it.
func TestNetworkLibvirtBoot(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	n := newLibvirtNet(t)
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	for _, c := range []struct{ network, says string }{
		{"network=vmfork-nonet", `libvirt network "vmfork-nonet" does not exist`},
		{"none", "network none"},
	} {
		r := d.cli("-q", "boot", d.n("bad"), "--kernel", d.guest.Kernel, "--initrd", d.guest.Initrd, "--network", c.network)
		if r.code != 2 || !strings.Contains(r.stderr, c.says) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("boot --network %s: %s; want exit 2 and one line saying %q", c.network, r, c.says)
		}
	}
	if len(domains(t, d.prefix)) != 0 || len(d.machines()) != 0 {
		t.Fatalf("refused boots left domains %v or machines %v", domains(t, d.prefix), d.machines())
	}
	p := d.n("vm")
	m := d.bootGuest(p, "--network", "network="+n.name)
	if got := d.networkOf(p); got != "network="+n.name {
		t.Errorf("ls --json: network %q, want network=%s", got, n.name)
	}
	if got := strings.ToLower(virshOK(t, "domiflist", p)); !strings.Contains(got, n.name) || !strings.Contains(got, strings.ToLower(m.MAC)) {
		t.Errorf("virsh domiflist %s:\n%s\nwant network %s and MAC %s", p, got, n.name, m.MAC)
	}
	if !eventually(time.Minute, func() bool { return len(n.leasesOf(t, m.MAC)) == 1 }) {
		t.Errorf("%s (%s) got no lease on %s: %+v", p, m.MAC, n.name, n.leases(t))
	}
}
