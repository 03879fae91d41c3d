//go:build integration

package tests

import (
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/tests/bench"
)

// TestIdentityDebian boots the stock Debian 12 guest in each variant
// (ifupdown + dhclient or systemd-networkd, with and without dbus) on a
// bridge with a DHCP server of its own, checks that it is the system the
// variant asks for (checkDebianVariant), forks it into three children, and
// checks that parent and children are pairwise distinct in machine-id,
// every SSH host key, MAC, hostname, IPv4 address, DHCP lease and a urandom
// sample; that each child is on its parent's bridge with a tap of its own,
// has exactly one IPv4 address on its NIC and pings the parent; that systemd
// says what it said in the parent before the fork, with no new failed
// units; that ssh-keyscan from the host (in the bridge's namespace) gets
// each child's new keys; and that each step names the mechanism the
// variant calls for.
func TestIdentityDebian(t *testing.T) {
	parallelParent(t) // heavy and self-contained (tests/doc.go, "Parallel")
	d := debianGuest(t)
	if len(d.Variants) != 4 {
		t.Fatalf("got variants %v, want ifupdown/networkd × dbus/nodbus", d.variantNames())
	}
	for _, v := range d.Variants {
		t.Run(v.Name, func(t *testing.T) {
			// Each variant its own bridge and env: they run beside other
			// tests, not one after another at the end of the suite.
			parallel(t)
			identityDebianVariant(t, v)
		})
	}
}

func identityDebianVariant(t *testing.T, v debianVariant) {
	b := newBridgeNet(t)
	e := newDebianEnv(t)
	b.inNamespace(t, e.env)
	start := time.Now()
	src := e.bootDebian("deb", v, "--network", "bridge="+b.bridge)
	t.Logf("%s: vmfork boot to answering agent: %v", v.Name, time.Since(start).Round(time.Millisecond))
	state := e.settle("deb")
	t.Logf("%s: systemctl is-system-running: %s after %v", v.Name, state, time.Since(start).Round(time.Millisecond))
	failedBefore := e.failedUnits("deb")
	// The parent is the system its variant asks for.
	checkDebianVariant(t, e, "deb", v, state)
	parent := debianFacts(t, e, "deb")
	parent.lease = b.leaseOf(t, src.MAC)
	if len(parent.ipv4) != 1 || parent.lease == "" || parent.ipv4[0] != parent.lease {
		t.Fatalf("parent: IPv4 %v, lease %q: want its one lease on the bridge", parent.ipv4, parent.lease)
	}
	if len(parent.hostKeys) < 2 {
		t.Fatalf("parent has host keys %v, want Debian's (rsa, ecdsa, ed25519)", parent.hostKeys)
	}

	res, r := e.forkID(0, "deb", "--count", "3", "--hostname", "deb-{n}")
	if len(res.Children) != 3 {
		t.Fatalf("fork: %+v (%s)", res, r)
	}
	// On the bridge as its parent (once TestNetworkBridgeChildrenDebian,
	// which booted a fifth Debian guest for these checks): a tap each.
	if taps := b.tapsOn(t); len(taps) != 4 {
		t.Errorf("taps on %s: %v, want one each for the source and its three children", b.bridge, taps)
	}
	seen := newDistinct(t)
	seen.add("deb", parent)
	for _, c := range res.Children {
		id := c.Identity
		if got := e.networkOf(c.Name); got != "bridge="+b.bridge {
			t.Errorf("%s's network is %q, want its source's bridge=%s", c.Name, got, b.bridge)
		}
		var steps []string
		for _, s := range id.Steps {
			steps = append(steps, s.Name+"="+s.Status)
			// The stock guest has no post-fork hooks.
			if s.Status != "ok" && !(s.Name == "vmfork.hooks" && s.Status == "skipped") {
				t.Errorf("%s: step %+v, want ok", c.Name, s)
			}
		}
		t.Logf("%s: ready %.0f ms, chain %.0f ms (overhead %.0f ms): %s", c.Name, c.ReadyMS, id.ElapsedMS, id.OverheadMS, stepTimes(id))
		// The mechanism each step names follows the variant.
		wantHost, wantNet := "(/etc/hostname and the kernel's name", "dhclient (pid"
		if v.DBus {
			wantHost = "(hostnamectl"
		}
		if v.Network == "networkd" {
			wantNet = "systemd-networkd restarted for a client id from the new machine-id"
		}
		if got := id.step("vmfork.hostname").Detail; !strings.Contains(got, wantHost) {
			t.Errorf("%s: hostname step %q, want %s", c.Name, got, wantHost)
		}
		if got := id.step("vmfork.network").Detail; !strings.Contains(got, wantNet) || !strings.Contains(got, "gratuitous ARP") {
			t.Errorf("%s: network step %q, want %s and a gratuitous ARP", c.Name, got, wantNet)
		}
		if got := id.step("vmfork.ssh-host-keys").Detail; !strings.Contains(got, "sshd reloaded") {
			t.Errorf("%s: ssh step %q, want sshd reloaded", c.Name, got)
		}

		f := debianFacts(t, e, c.Name)
		f.lease = b.leaseOf(t, f.mac)
		if len(f.ipv4) != 1 || f.ipv4[0] != f.lease {
			t.Errorf("%s: IPv4 on eth0 %v, lease %q: want exactly its own lease", c.Name, f.ipv4, f.lease)
		}
		if f.hostname != "deb-"+c.Name[len(c.Name)-1:] || f.machineID != id.MachineID || f.mac != id.MAC {
			t.Errorf("%s: hostname %q, machine-id %q, MAC %q; reported %q %q %q", c.Name, f.hostname, f.machineID, f.mac, id.Hostname, id.MachineID, id.MAC)
		}
		if len(f.hostKeys) != len(parent.hostKeys) {
			t.Errorf("%s: host keys %v, want the parent's types %v", c.Name, f.hostKeys, parent.hostKeys)
		}
		seen.add(c.Name, f)

		if got := e.settle(c.Name); got != state {
			t.Errorf("%s: systemctl is-system-running %q, the parent's was %q", c.Name, got, state)
		}
		for _, u := range e.failedUnits(c.Name) {
			if !contains(failedBefore, u) {
				t.Errorf("%s: unit %s failed after the fork (the parent had %v)", c.Name, u, failedBefore)
			}
		}
		if out, err := e.tryExec(c.Name, "ping", "-c", "2", "-W", "2", parent.lease); err != nil {
			t.Errorf("%s cannot ping the parent at %s over the bridge: %v: %s", c.Name, parent.lease, err, out)
		}
		// What a client on the network gets: the child's new keys.
		scanned := keyscan(t, b, f.lease)
		if want := strings.Join(f.hostKeys, "\n"); scanned != want {
			t.Errorf("%s: ssh-keyscan %s:\n%s\nwant its new keys:\n%s", c.Name, f.lease, scanned, want)
		}
	}
}

// machineFacts is what makes a machine itself.
type machineFacts struct {
	machineID, hostname, mac string
	ipv4                     []string
	hostKeys                 []string // "type base64", sorted
	urandom                  string
	lease                    string
}

func debianFacts(t *testing.T, e *debianEnv, name string) machineFacts {
	t.Helper()
	out := e.exec(name, "sh", "-c", `cat /etc/machine-id; hostname; cat /sys/class/net/eth0/address
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; echo
ip -4 -o addr show dev eth0 | awk '{ print "ipv4", $4 }'
for f in /etc/ssh/ssh_host_*_key.pub; do awk '{ print "key", $1, $2 }' "$f"; done`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 4 {
		t.Fatalf("%s: facts %q", name, out)
	}
	f := machineFacts{machineID: lines[0], hostname: lines[1], mac: lines[2], urandom: lines[3]}
	for _, l := range lines[4:] {
		k, v, _ := strings.Cut(l, " ")
		switch k {
		case "ipv4":
			f.ipv4 = append(f.ipv4, strings.SplitN(v, "/", 2)[0])
		case "key":
			f.hostKeys = append(f.hostKeys, v)
		}
	}
	sort.Strings(f.hostKeys)
	return f
}

// distinct checks that no two machines share a fact.
type distinct struct {
	t    *testing.T
	seen map[string]string // kind + value → machine
}

func newDistinct(t *testing.T) *distinct { return &distinct{t: t, seen: map[string]string{}} }

func (d *distinct) add(name string, f machineFacts) {
	d.t.Helper()
	vals := map[string][]string{
		"machine-id": {f.machineID}, "hostname": {f.hostname}, "MAC": {f.mac}, "urandom sample": {f.urandom},
		"IPv4 address": f.ipv4, "DHCP lease": {f.lease}, "SSH host key": f.hostKeys,
	}
	for kind, vs := range vals {
		for _, v := range vs {
			if v == "" {
				d.t.Errorf("%s has no %s", name, kind)
				continue
			}
			if other, dup := d.seen[kind+"\x00"+v]; dup {
				d.t.Errorf("%s has %s's %s %s", name, other, kind, v)
			}
			d.seen[kind+"\x00"+v] = name
		}
	}
}

// keyscan returns the host keys sshd at addr serves ("type base64", sorted),
// asked from inside b's namespace, retrying while sshd re-executes itself.
func keyscan(t *testing.T, b *bridgeNet, addr string) string {
	t.Helper()
	var out []byte
	for try := 0; try < 10; try++ {
		var err error
		out, err = exec.Command("ip", "netns", "exec", b.ns, "ssh-keyscan", "-T", "10", "-t", "rsa,ecdsa,ed25519", addr).Output()
		if err == nil && len(out) > 0 {
			break
		}
		time.Sleep(time.Second)
	}
	var keys []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && !strings.HasPrefix(l, "#") {
			keys = append(keys, f[1]+" "+f[2])
		}
	}
	sort.Strings(keys)
	return strings.Join(keys, "\n")
}

func stepTimes(id *identityJSON) string {
	var b []string
	for _, s := range id.Steps {
		b = append(b, fmt.Sprintf("%s %.0f", strings.TrimPrefix(s.Name, "vmfork."), s.DurationMS))
	}
	return strings.Join(b, ", ")
}

// TestIdentityDebianMissingTool: a guest that lacks what a step needs gets
// one line naming what it lacks and what to do, and the fork says the child
// failed. Here the Debian guest's dhclient, which configured eth0, is
// removed from the source before the fork (the running one stays). The
// source is a child of the shared template (tests/doc.go), whose own
// network step ran dhclient on eth0.
func TestIdentityDebianMissingTool(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newDebianEnv(t)
	e.forkDebian("deb")
	e.waitIPv4("deb", 2*time.Minute)
	e.exec("deb", "mv", "/sbin/dhclient", "/sbin/dhclient.gone")
	// Its only child failed: the fork failed (exit 1), and says why.
	res, r := e.forkID(1, "deb", "kid")
	if len(res.Failed) != 1 {
		t.Fatalf("fork %+v (%s), want kid failed", res, r)
	}
	want := `identity: step "vmfork.network": the guest has no dhclient any more, the DHCP client (dhclient) that configured eth0: install it (isc-dhcp-client for dhclient), set network.dhcp_command, use --network static or none, or --skip-step vmfork.network`
	if got := res.Failed[0].Error; got != want {
		t.Errorf("error:\n got %s\nwant %s", got, want)
	}
	if !strings.Contains(r.stderr, "kid: "+want) {
		t.Errorf("stderr does not carry the one-line error: %q", r.stderr)
	}
	// --skip-step, the way out it names, works.
	res, _ = e.forkID(0, "deb", "kid2", "--skip-step", "vmfork.network")
	if s := res.Children[0].Identity.step("vmfork.network"); s.Status != "skipped" {
		t.Errorf("network step %+v, want skipped by request", s)
	}
}

// BenchmarkIdentityChain measures the identity chain, per step, on the
// busybox test guest and on the stock Debian guest (ifupdown-nodbus, QEMU's
// user network, DHCP), one child per round, in the same run: the Debian
// chain's time is reported as a ratio to the busybox chain's (target ≤ 2×).
//
//	go test -tags integration -run '^$' -bench BenchmarkIdentityChain -benchtime 8x ./tests/
//
// Step durations of batched steps are measured in the guest; "overhead" is
// the chain's time in no step (agent round trips, process starts).
func BenchmarkIdentityChain(b *testing.B) {
	type guestRun struct {
		name  string
		steps map[string][]float64
		chain []float64
		ready []float64
		over  []float64
		cmds  []float64
	}
	measure := func(e *env, src string, gr *guestRun) {
		gr.steps = map[string][]float64{}
		for i := 0; i < b.N; i++ {
			name := fmt.Sprintf("c%d", i)
			res, _ := e.forkID(0, src, name)
			c := res.Children[0]
			for _, s := range c.Identity.Steps {
				gr.steps[s.Name] = append(gr.steps[s.Name], s.DurationMS)
			}
			gr.chain = append(gr.chain, c.Identity.ElapsedMS)
			gr.ready = append(gr.ready, c.ReadyMS)
			gr.over = append(gr.over, c.Identity.OverheadMS)
			gr.cmds = append(gr.cmds, float64(c.Identity.GuestCommands))
			e.ok("rm", "--force", name)
		}
	}
	bb := &guestRun{name: "busybox"}
	deb := &guestRun{name: "debian"}
	{
		e := newEnv(b)
		e.boot("src")
		e.exec("src", "head", "-c", "16", "/dev/urandom")
		measure(e, "src", bb)
	}
	if os.Getenv("VMFORK_DEBIAN_GUEST") == "" {
		// The busybox guest alone, e.g. next to an older vmfork.
		fmt.Printf("\nidentity chain, busybox guest, %d one-child forks: chain %.1f ms, overhead %.1f ms, ready %.1f ms\n",
			b.N, bench.Median(bb.chain), bench.Median(bb.over), bench.Median(bb.ready))
		for n, v := range bb.steps {
			fmt.Printf("  %-22s %8.1f\n", n, bench.Median(v))
		}
		b.ReportMetric(bench.Median(bb.chain), "busybox-chain-ms")
		return
	}
	{
		// The source is a child of the shared template (tests/doc.go):
		// what is measured is its children's chain, as from a booted one.
		d := newDebianEnv(b)
		d.forkDebian("deb")
		d.settle("deb")
		d.waitIPv4("deb", 2*time.Minute)
		measure(d.env, "deb", deb)
	}
	med := bench.Median
	fmt.Printf("\nidentity chain, %d one-child forks per guest (medians, ms)\n", b.N)
	fmt.Printf("%-24s %10s %10s\n", "step", "busybox", "debian")
	var names []string
	for n := range deb.steps {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Printf("%-24s %10.1f %10.1f\n", n, med(bb.steps[n]), med(deb.steps[n]))
	}
	fmt.Printf("%-24s %10.1f %10.1f\n", "overhead (no step)", med(bb.over), med(deb.over))
	fmt.Printf("%-24s %10.0f %10.0f\n", "guest commands", med(bb.cmds), med(deb.cmds))
	fmt.Printf("%-24s %10.1f %10.1f\n", "chain", med(bb.chain), med(deb.chain))
	fmt.Printf("%-24s %10.1f %10.1f\n", "child ready", med(bb.ready), med(deb.ready))
	fmt.Printf("debian chain / busybox chain: %.2fx\n", med(deb.chain)/med(bb.chain))
	b.ReportMetric(med(bb.chain), "busybox-chain-ms")
	b.ReportMetric(med(deb.chain), "debian-chain-ms")
	b.ReportMetric(med(deb.chain)/med(bb.chain), "debian/busybox")
}
