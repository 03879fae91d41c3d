package customize

import (
	"context"
	"encoding/base64"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmfork/vmfork/qmp"
)

// The mechanism tests run the steps' real scripts, batched as in a guest, on
// the host's dash and busybox sh, against a fake guest: a directory tree
// that the scripts see as / ($R) and a PATH of stubs that log their
// arguments. Nothing else is on that PATH, so a tool the test does not
// provide is absent, as in a guest without it, and no real ip or hostname
// can touch the host.

type guestTree struct {
	t    *testing.T
	root string
	bin  string
	log  string
	mu   sync.Mutex
}

// hostTools are the real commands the scripts may run on a fake guest.
var hostTools = []string{"tr", "sleep", "chmod", "cat", "rm", "mkdir", "tail", "cmp"}

func newGuestTree(t *testing.T) *guestTree {
	t.Helper()
	g := &guestTree{t: t, root: t.TempDir(), bin: t.TempDir()}
	g.log = filepath.Join(g.root, "stub.log")
	for _, tool := range hostTools {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("no %s on this host", tool)
		}
		if err := os.Symlink(p, filepath.Join(g.bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	g.stub("ip", "")
	// Never the host's ss: its -K would close the host's own connections.
	g.stub("ss", "exit 127")
	g.dir("/run")
	g.dir("/proc")
	return g
}

// file writes path (in the guest) with content.
func (g *guestTree) file(path, content string) {
	g.t.Helper()
	p := g.root + path
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		g.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		g.t.Fatal(err)
	}
}

func (g *guestTree) read(path string) string {
	g.t.Helper()
	b, err := os.ReadFile(g.root + path)
	if err != nil {
		g.t.Fatal(err)
	}
	return string(b)
}

func (g *guestTree) dir(path string) {
	g.t.Helper()
	if err := os.MkdirAll(g.root+path, 0o755); err != nil {
		g.t.Fatal(err)
	}
}

// socket makes path a listening unix socket, as a running bus's.
func (g *guestTree) socket(path string) {
	g.t.Helper()
	g.dir(filepath.Dir(path))
	l, err := net.Listen("unix", g.root+path)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { l.Close() })
}

// stub puts a command name on the guest's PATH that logs "name args" and
// then runs body (shell; $STUBROOT is the guest's root).
func (g *guestTree) stub(name, body string) {
	g.t.Helper()
	script := "#!/bin/sh\necho \"" + name + " $*\" >>\"$STUBROOT/stub.log\"\n" + body + "\n"
	if err := os.WriteFile(filepath.Join(g.bin, name), []byte(script), 0o755); err != nil {
		g.t.Fatal(err)
	}
}

// note adds a line to the stub log, for the order of host-side events.
func (g *guestTree) note(line string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f, err := os.OpenFile(g.log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		f.WriteString(line + "\n")
		f.Close()
	}
}

func (g *guestTree) calls() string {
	b, _ := os.ReadFile(g.log)
	return string(b)
}

// env returns an Env whose agent runs the scripts in shell sh on this tree.
func (g *guestTree) env(sh []string, a *hostAgent) *Env {
	a.t, a.sh, a.root = g.t, sh, g.root
	return &Env{
		Agent: a,
		Child: testChild(2),
		Link: LinkFunc(func(_ context.Context, up bool) error {
			g.note("LINK " + map[bool]string{true: "up", false: "down"}[up])
			return nil
		}),
		root:      g.root,
		scriptEnv: []string{"VMFORK_ROOT=" + g.root, "STUBROOT=" + g.root, "PATH=" + g.bin},
	}
}

// eachShell runs f on a fresh tree with dash, Debian's /bin/sh. Never with
// busybox sh: Debian's busybox runs its own applets (ip, udhcpc, hostname)
// before anything on PATH, so the stubs would not stand in for them and the
// scripts would change the host's network. For the same reason the tests'
// NIC is one no host has (testNIC).
func eachShell(t *testing.T, f func(t *testing.T, g *guestTree, sh []string)) {
	p, err := exec.LookPath("dash")
	if err != nil {
		t.Skip("no dash on this host")
	}
	f(t, newGuestTree(t), []string{p})
}

// testNIC is the fake guest's NIC: a name no host has, so that a real ip
// run by mistake fails ("Cannot find device") instead of changing the
// host's eth0.
const testNIC = "vmfk-test0"

func runOn(t *testing.T, g *guestTree, sh []string, a *hostAgent, steps ...Step) (*Env, *Result, error) {
	t.Helper()
	if a == nil {
		a = &hostAgent{}
	}
	env := g.env(sh, a)
	res, err := Run(t.Context(), NewChain(steps...), env)
	return env, res, err
}

func TestHostnameMechanisms(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		g.file("/proc/sys/kernel/hostname", "web\n")
		g.file("/etc/hostname", "web\n")
		g.file("/etc/hosts", "127.0.0.1\tlocalhost\n127.0.1.1\tweb\n")
		g.stub("hostname", "exit 1")
		g.stub("hostnamectl", "exit 1")
		// No bus (a minimal server): the files, never hostnamectl.
		g.dir("/run/systemd/system")
		_, res, err := runOn(t, g, sh, nil, HostnameStep("web-{n}"))
		if err != nil {
			t.Fatal(err)
		}
		if d := res.Steps[0].Detail; !strings.HasPrefix(d, "web-2 (") || !strings.Contains(d, "/etc/hostname and the kernel's name, ") {
			t.Errorf("detail %q, want the files named", d)
		}
		if g.read("/etc/hostname") != "web-2\n" || g.read("/proc/sys/kernel/hostname") != "web-2" || g.read("/etc/hosts") != "127.0.0.1\tlocalhost\n127.0.1.1 web-2\n" {
			t.Errorf("files: %q %q %q", g.read("/etc/hostname"), g.read("/proc/sys/kernel/hostname"), g.read("/etc/hosts"))
		}
		if strings.Contains(g.calls(), "hostnamectl") {
			t.Errorf("hostnamectl ran without a bus:\n%s", g.calls())
		}
		// A bus that answers: hostnamectl.
		g.socket("/run/dbus/system_bus_socket")
		g.stub("hostnamectl", `printf %s "$2" >"$STUBROOT/proc/sys/kernel/hostname"`)
		_, res, err = runOn(t, g, sh, nil, HostnameStep("db-{n}"))
		if err != nil || !strings.HasPrefix(res.Steps[0].Detail, "db-2 (hostnamectl, ") || !strings.Contains(g.calls(), "hostnamectl set-hostname db-2") {
			t.Errorf("with a bus: %v, detail %q, calls:\n%s", err, res.Steps[0].Detail, g.calls())
		}
		// A bus whose hostnamed fails: the files, and the detail says so.
		g.stub("hostnamectl", `echo "Failed to connect to bus: No such file or directory" >&2; exit 1`)
		_, res, err = runOn(t, g, sh, nil, HostnameStep("mx-{n}"))
		if err != nil || !strings.Contains(res.Steps[0].Detail, "hostnamectl failed (Failed to connect to bus: No such file or directory)") ||
			g.read("/etc/hostname") != "mx-2\n" {
			t.Errorf("hostnamectl failing: %v, detail %q, /etc/hostname %q", err, res.Steps[0].Detail, g.read("/etc/hostname"))
		}
	})
}

func TestMachineIDMechanisms(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		g.stub("systemctl", "")
		// No /etc/machine-id: nothing to do.
		_, res, err := runOn(t, g, sh, nil, MachineIDStep())
		if err != nil || res.Steps[0].Status != StatusSkipped {
			t.Fatalf("no machine-id: %v %+v", err, res.Steps)
		}
		// systemd with journald and a D-Bus copy of its own.
		g.file("/etc/machine-id", "0123\n")
		g.file("/var/lib/dbus/machine-id", "0123\n")
		g.dir("/run/systemd/system")
		g.file("/run/systemd/journal/socket", "")
		_, res, err = runOn(t, g, sh, nil, MachineIDStep())
		if err != nil {
			t.Fatal(err)
		}
		id := res.MachineID
		if len(id) != 32 || g.read("/etc/machine-id") != id+"\n" || g.read("/var/lib/dbus/machine-id") != id+"\n" {
			t.Errorf("machine-id %q, files %q %q", id, g.read("/etc/machine-id"), g.read("/var/lib/dbus/machine-id"))
		}
		if d := res.Steps[0].Detail; !strings.Contains(d, "/var/lib/dbus/machine-id (a copy)") || !strings.Contains(d, "systemd-journald restarting") {
			t.Errorf("detail %q", d)
		}
		// The restart runs in the background: wait (bounded) for its call.
		for i := 0; i < 100 && !strings.Contains(g.calls(), "systemctl --no-block restart systemd-journald.service"); i++ {
			time.Sleep(20 * time.Millisecond)
		}
		if !strings.Contains(g.calls(), "systemctl --no-block restart systemd-journald.service") {
			t.Errorf("journald not restarted:\n%s", g.calls())
		}
		// The usual link is left alone: it follows.
		os.Remove(g.root + "/var/lib/dbus/machine-id")
		os.Symlink("/etc/machine-id", g.root+"/var/lib/dbus/machine-id")
		_, res, err = runOn(t, g, sh, nil, MachineIDStep())
		if err != nil || strings.Contains(res.Steps[0].Detail, "a copy") {
			t.Errorf("with a link: %v, detail %q", err, res.Steps[0].Detail)
		}
	})
}

// dhclientCmd is ifupdown's dhclient command line on Debian 12.
var dhclientCmd = []string{"/sbin/dhclient", "-4", "-v", "-i", "-pf", "/run/dhclient.vmfk-test0.pid", "-lf", "/var/lib/dhcp/dhclient.vmfk-test0.leases", "-I", "-df", "/var/lib/dhcp/dhclient6.vmfk-test0.leases", testNIC}

// nicTree gives the tree an vmfk-test0 (ifindex 2) and an ip that shows addr for it.
func nicTree(g *guestTree, addr string) {
	g.file("/sys/class/net/vmfk-test0/ifindex", "2\n")
	g.file("/sys/class/net/vmfk-test0/operstate", "up\n")
	g.file("/proc/sys/net/ipv4/conf/vmfk-test0/arp_notify", "0\n")
	g.stub("ip", ipStub(addr))
}

// ipStub is iproute2's ip as the tests see it: "addr show" shows addr, and
// -batch logs each command it reads as the command line it stands for.
func ipStub(addr string) string {
	return `case "$*" in
*"addr show"*) echo "2: vmfk-test0    inet ` + addr + ` brd 10.0.2.255 scope global vmfk-test0" ;;
"-4 -batch -") while read -r l; do case $l in addr*) echo "ip -4 $l" ;; *) echo "ip $l" ;; esac >>"$STUBROOT/stub.log"; done ;;
esac`
}

func netAgent(addrs ...string) *hostAgent {
	var ips []qmp.IPAddress
	for _, a := range addrs {
		ip, n, _ := strings.Cut(a, "/")
		ips = append(ips, qmp.IPAddress{Type: "ipv4", Address: ip, Prefix: atoi(n)})
	}
	return &hostAgent{ifaces: []qmp.NetworkInterface{{Name: testNIC, HardwareAddress: "52:54:00:00:00:01", IPAddresses: ips}}}
}

// before reports whether a comes before b in s, both present.
func before(s, a, b string) bool {
	i, j := strings.Index(s, a), strings.Index(s, b)
	return i >= 0 && j > i
}

func TestNetworkIfupdownDhclient(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		nicTree(g, "10.0.2.16/24")
		// The inherited client: a pid no process has (beyond pid_max).
		g.file("/proc/99999991/comm", "dhclient\n")
		g.file("/proc/99999991/cmdline", strings.Join(dhclientCmd, "\x00")+"\x00")
		g.file("/proc/99999991/exe", "")
		g.file("/proc/1/comm", "systemd\n")
		g.file("/var/lib/dhcp/dhclient.vmfk-test0.leases", "lease { fixed-address 10.0.2.15; }\n")
		g.file("/var/lib/dhcp/dhclient6.vmfk-test0.leases", "default-duid \"\\000\\001\";\n")
		g.stub("dhclient", "")
		g.dir("/sbin")
		os.Symlink(filepath.Join(g.bin, "dhclient"), g.root+"/sbin/dhclient")
		_, res, err := runOn(t, g, sh, netAgent("10.0.2.16/24"), NetworkStep(NetworkSpec{}))
		if err != nil {
			t.Fatalf("%v\ncalls:\n%s", err, g.calls())
		}
		calls := g.calls()
		// Down, flush, new MAC with the link down; the same client, as it
		// ran, once the link is up; never a release (-r).
		mac := testChild(2).MAC
		for _, w := range [][2]string{
			{"ip link set dev vmfk-test0 down", "ip -4 addr flush dev vmfk-test0"},
			{"ip -4 addr flush dev vmfk-test0", "ip link set dev vmfk-test0 address " + mac + " up"},
			{"ip link set dev vmfk-test0 address " + mac + " up", "LINK up"},
			{"LINK up", "dhclient " + strings.Join(dhclientCmd[1:], " ")},
		} {
			if !before(calls, w[0], w[1]) {
				t.Errorf("%q not before %q in\n%s", w[0], w[1], calls)
			}
		}
		if strings.Contains(calls, "dhclient -r") || strings.Contains(calls, "dhclient -x") {
			t.Errorf("the inherited lease was released:\n%s", calls)
		}
		if g.read("/var/lib/dhcp/dhclient.vmfk-test0.leases") != "" || g.read("/var/lib/dhcp/dhclient6.vmfk-test0.leases") != "" {
			t.Errorf("lease files (and dhclient's DUID) kept")
		}
		if g.read("/proc/sys/net/ipv4/conf/vmfk-test0/arp_notify") != "1\n" || strings.Count(calls, "ip link set dev vmfk-test0 address "+mac) != 2 {
			t.Errorf("no gratuitous ARP: arp_notify %q, calls\n%s", g.read("/proc/sys/net/ipv4/conf/vmfk-test0/arp_notify"), calls)
		}
		d := res.Steps[0].Detail
		for _, w := range []string{"dhcp: 10.0.2.16/24", "dhclient (pid 99999991) stopped without a release", "lease files emptied", "dhclient restarted as it ran", "gratuitous ARP (arp_notify)"} {
			if !strings.Contains(d, w) {
				t.Errorf("detail %q lacks %q", d, w)
			}
		}
	})
}

func TestNetworkSystemdNetworkd(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		nicTree(g, "10.0.2.16/24")
		g.dir("/run/systemd/system")
		g.file("/run/systemd/netif/links/2", "ADMIN_STATE=configured\nOPER_STATE=routable\n")
		g.file("/run/systemd/netif/leases/2", "ADDRESS=10.0.2.15\n")
		g.stub("systemctl", "")
		a := netAgent("10.0.2.16/24")
		env := g.env(sh, a)
		// networkd gets its lease once the link is up.
		env.Link = LinkFunc(func(context.Context, bool) error {
			g.note("LINK up")
			g.file("/run/systemd/netif/leases/2", "ADDRESS=10.0.2.16\n")
			return nil
		})
		res, err := Run(t.Context(), NewChain(NetworkStep(NetworkSpec{})), env)
		if err != nil {
			t.Fatalf("%v\ncalls:\n%s", err, g.calls())
		}
		calls := g.calls()
		if !before(calls, "systemctl stop systemd-networkd.service", "systemctl --no-block start systemd-networkd.service") ||
			!before(calls, "systemctl --no-block start systemd-networkd.service", "LINK up") {
			t.Errorf("networkd not restarted (for the new machine-id's client id) before the link went up:\n%s", calls)
		}
		if d := res.Steps[0].Detail; !strings.Contains(d, "systemd-networkd restarted for a client id from the new machine-id") || !strings.Contains(d, "systemd-networkd lease") {
			t.Errorf("detail %q", d)
		}
		// Static addresses: a runtime .network file of its own.
		g.file("/run/systemd/netif/leases/2", "")
		_, res, err = runOn(t, g, sh, netAgent("10.0.2.22/24"), NetworkStep(NetworkSpec{Addresses: []string{"10.0.2.21/24", "10.0.2.22/24"}, Gateway: "10.0.2.2"}))
		if err != nil {
			t.Fatal(err)
		}
		if got := g.read("/run/systemd/network/00-vmfork-vmfk-test0.network"); got != "[Match]\nName=vmfk-test0\n[Network]\nDHCP=no\nAddress=10.0.2.22/24\nGateway=10.0.2.2\n" {
			t.Errorf("network file %q", got)
		}
	})
}

func TestNetworkManager(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		nicTree(g, "10.0.2.16/24")
		g.file("/run/NetworkManager/NetworkManager.pid", "99999992\n")
		g.file("/proc/99999992/comm", "NetworkManager\n")
		g.file("/var/lib/NetworkManager/internal-1234-vmfk-test0.lease", "ADDRESS=10.0.2.15\n")
		g.stub("systemctl", "")
		_, res, err := runOn(t, g, sh, netAgent("10.0.2.16/24"), NetworkStep(NetworkSpec{}))
		if err != nil {
			t.Fatalf("%v\ncalls:\n%s", err, g.calls())
		}
		if calls := g.calls(); !before(calls, "systemctl stop NetworkManager.service", "LINK up") || !before(calls, "LINK up", "systemctl start NetworkManager.service") {
			t.Errorf("calls:\n%s", calls)
		}
		if g.read("/var/lib/NetworkManager/internal-1234-vmfk-test0.lease") != "" || !strings.Contains(res.Steps[0].Detail, "NetworkManager restarted") {
			t.Errorf("lease kept, or detail %q", res.Steps[0].Detail)
		}
		// Static addresses are not done there: one line that says what to do.
		_, _, err = runOn(t, g, sh, netAgent(), NetworkStep(NetworkSpec{Addresses: []string{"10.0.2.21/24", "10.0.2.22/24"}}))
		if err == nil || err.Error() != `step "vmfork.network": static addresses on a NetworkManager guest are not supported: use --network dhcp or none, or --skip-step vmfork.network` {
			t.Errorf("static on NetworkManager: %v", err)
		}
	})
}

func TestNetworkOneShotAndMissingClient(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		nicTree(g, "10.0.2.16/24")
		// The test guest: udhcpc ran once at boot and quit.
		g.stub("udhcpc", `case "$*" in *" -q "*) ;; *) exit 1 ;; esac; s=; while [ $# -gt 0 ]; do [ "$1" = -s ] && s=$2; shift; done; [ -x "$s" ]`)
		_, res, err := runOn(t, g, sh, netAgent("10.0.2.16/24"), NetworkStep(NetworkSpec{}))
		if err != nil || !strings.Contains(res.Steps[0].Detail, "udhcpc -q") {
			t.Fatalf("udhcpc: %v %+v\n%s", err, res.Steps, g.calls())
		}
		// Two IPv4 addresses afterwards fail the step.
		_, _, err = runOn(t, g, sh, netAgent("10.0.2.15/24", "10.0.2.16/24"), NetworkStep(NetworkSpec{}))
		if err == nil || !strings.Contains(err.Error(), "vmfk-test0 has 2 IPv4 addresses after the network step (10.0.2.15/24 10.0.2.16/24), want exactly one") {
			t.Errorf("two addresses: %v", err)
		}
		// No DHCP client at all: one line naming what to install or skip,
		// before anything changed.
		os.Remove(filepath.Join(g.bin, "udhcpc"))
		os.Remove(g.log)
		_, res, err = runOn(t, g, sh, netAgent(), NetworkStep(NetworkSpec{}))
		want := `step "vmfork.network": the guest has no DHCP client (systemd-networkd, NetworkManager, dhclient, udhcpc or dhcpcd): install isc-dhcp-client, set network.dhcp_command, use --network static or none, or --skip-step vmfork.network`
		if err == nil || err.Error() != want || strings.Contains(err.Error(), "\n") {
			t.Errorf("no DHCP client:\n got %v\nwant %s", err, want)
		}
		if strings.Contains(g.calls(), "LINK up") {
			t.Errorf("the link went up for a DHCP client the guest lacks:\n%s", g.calls())
		}
	})
}

// keyTree gives the tree SSH host keys of types, made as ssh-keygen would.
func keyTree(t *testing.T, g *guestTree, types ...KeyType) map[string]string {
	old := map[string]string{}
	for _, kt := range types {
		k, err := generateKey(kt)
		if err != nil {
			t.Fatal(err)
		}
		hk, err := encodeKey(kt, k, "root@web")
		if err != nil {
			t.Fatal(err)
		}
		g.file(kt.file(), string(hk.Private))
		os.Chmod(g.root+kt.file(), 0o600)
		g.file(kt.file()+".pub", string(hk.Public))
		old[kt.Alg] = string(hk.Public)
	}
	return old
}

func TestSSHHostKeys(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		g.stub("systemctl", "")
		// No host keys: skipped.
		_, res, err := runOn(t, g, sh, nil, SSHHostKeysStep())
		if err != nil || res.Steps[0].Status != StatusSkipped {
			t.Fatalf("no keys: %v %+v", err, res.Steps)
		}
		types := []KeyType{{Alg: "rsa", Bits: 2048}, {Alg: "ed25519"}}
		old := keyTree(t, g, types...)
		// A running sshd (a process of this test, as sshd in the tree's
		// /proc) gets SIGHUP, as systemctl reload ssh would send it.
		// A test run under nohup ignores SIGHUP, and so would a child it
		// starts; a process with a handler starts its children with the
		// default.
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		sshd := exec.Command("sleep", "60")
		err = sshd.Start()
		signal.Stop(hup)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sshd.Process.Kill(); sshd.Wait() })
		pid := sshd.Process.Pid
		g.file("/run/sshd.pid", itoa(pid)+"\n")
		g.file("/proc/"+itoa(pid)+"/comm", "sshd\n")
		_, res, err = runOn(t, g, sh, nil, SSHHostKeysStep())
		if err != nil {
			t.Fatal(err)
		}
		if d := res.Steps[0].Detail; d != "new rsa-2048, ed25519 host keys; sshd reloaded (SIGHUP to pid "+itoa(pid)+")" {
			t.Errorf("detail %q", d)
		}
		if err := sshd.Wait(); err == nil || !strings.Contains(err.Error(), "hangup") {
			t.Errorf("sshd: %v, want killed by SIGHUP", err)
		}
		for _, kt := range types {
			pub := g.read(kt.file() + ".pub")
			got, err := ParseKeyType([]byte(pub))
			if err != nil || got != kt || pub == old[kt.Alg] || !strings.HasSuffix(pub, " root@web-2\n") {
				t.Errorf("%s: new public key %q (%v), type %v", kt, pub, err, got)
			}
			priv, err := sshParsePrivate([]byte(g.read(kt.file())))
			if err != nil || priv != strings.Fields(pub)[1] {
				t.Errorf("%s: private key does not match its public key: %v", kt, err)
			}
			for f, mode := range map[string]os.FileMode{kt.file(): 0o600, kt.file() + ".pub": 0o644} {
				if st, _ := os.Stat(g.root + f); st.Mode().Perm() != mode {
					t.Errorf("%s: mode %v, want %v", f, st.Mode().Perm(), mode)
				}
			}
		}
		if _, err := os.Stat(g.root + KeyType{Alg: "ecdsa"}.file()); err == nil {
			t.Errorf("an ecdsa key was made that the guest did not have")
		}
		// No sshd running, a service unit: systemctl.
		os.Remove(g.root + "/run/sshd.pid")
		g.dir("/run/systemd/system")
		g.file("/lib/systemd/system/ssh.service", "")
		_, res, err = runOn(t, g, sh, nil, SSHHostKeysStep())
		if err != nil || !strings.Contains(g.calls(), "systemctl try-reload-or-restart ssh.service") {
			t.Errorf("systemd: %v %+v\n%s", err, res.Steps, g.calls())
		}
	})
}

func TestKeyMakerPrefetch(t *testing.T) {
	var m KeyMaker
	kt := KeyType{Alg: "ed25519"}
	m.Prefetch([]KeyType{kt}, 2)
	a, err1 := m.Take(t.Context(), kt)
	b, err2 := m.Take(t.Context(), kt)
	c, err3 := m.Take(t.Context(), kt) // beyond the prefetched: made now
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	keys := map[string]bool{}
	for _, k := range []any{a, b, c} {
		keys[string(k.(interface{ Seed() []byte }).Seed())] = true
	}
	if len(keys) != 3 {
		t.Errorf("%d distinct keys of 3 taken", len(keys))
	}
	if _, err := generateKey(KeyType{Alg: "ecdsa", Bits: 300}); err == nil {
		t.Errorf("an ecdsa key of 300 bits was made")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// sshParsePrivate returns the base64 public key of an OpenSSH private key
// file, as its .pub line has it.
func sshParsePrivate(b []byte) (string, error) {
	k, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(k.PublicKey().Marshal()), nil
}

// A part's input reaches that part whole, newlines and all, and no process
// a batch starts inherits it: it comes in the environment, which the batch's
// shell unsets before the first part.
func TestPartInputStaysInTheShell(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		const input = "line one\n%vmfork% E\n\tsecret = 'x' $HOME\n"
		var got, inherited string
		step := func(name, script string, in []byte, done func(string)) Step {
			return Step{Name: name, Parts: func(context.Context, *Env) ([]*Part, error) {
				return []*Part{{Script: script, Input: in, Done: func(_ *Env, out string) error { done(out); return nil }}}, nil
			}}
		}
		_, res, err := runOn(t, g, sh, nil,
			step("env", `/usr/bin/env`, nil, func(out string) { inherited = out }),
			step("input", `printf '%s' "$vmfork_input"`, []byte(input), func(out string) { got = out }),
		)
		if err != nil {
			t.Fatalf("%v %+v", err, res.Steps)
		}
		if res.GuestCommands != 1 {
			t.Errorf("%d guest commands, want the two parts in one", res.GuestCommands)
		}
		if got != strings.TrimSuffix(input, "\n") {
			t.Errorf("the part's input = %q, want %q", got, input)
		}
		if strings.Contains(inherited, inputVar) || strings.Contains(inherited, "secret = ") { // not "secret": a checkout path may hold it
			t.Errorf("a process of the batch inherited the input:\n%s", inherited)
		}
		if !strings.Contains(inherited, "LC_ALL=C") {
			t.Errorf("env printed %q, want the batch's environment", inherited)
		}
	})
}
