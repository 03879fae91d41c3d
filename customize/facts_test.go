package customize

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

func TestReadFacts(t *testing.T) {
	a := newFakeAgent()
	a.files["/etc/os-release"] = []byte("ID=debian\n")
	k, err := generateKey(KeyType{Alg: "ed25519"})
	if err != nil {
		t.Fatal(err)
	}
	hk, err := encodeKey(KeyType{Alg: "ed25519"}, k, "root@web")
	if err != nil {
		t.Fatal(err)
	}
	a.files[sshDir+"/ssh_host_ed25519_key.pub"] = hk.Public
	a.files["/proc/431/cmdline"] = []byte(strings.Join(dhclientCmd, "\x00") + "\x00")
	a.scripts[dhcpScanScript] = func([]string) qmp.ExecStatus { return ok("431 dhclient\n77 dhclient\n") }
	f, err := ReadFacts(t.Context(), a, []string{"52:54:00:00:00:01"})
	if err != nil {
		t.Fatal(err)
	}
	want := &Facts{
		Date: "gnu",
		SSH:  &SSHFacts{Types: []KeyType{{Alg: "ed25519"}}},
		NIC:  &NICFacts{Name: "eth0", MAC: "52:54:00:00:00:01"},
		DHCP: &DHCPFacts{Clients: []DHCPClient{{431, "dhclient"}, {77, "dhclient"}}, Cmdline: dhclientCmd},
	}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("facts = %+v\nwant %+v", f, want)
	}
	if got := f.DHCP.arg(); got != "431:dhclient 77:dhclient" {
		t.Errorf("script argument %q", got)
	}

	// A busybox guest whose udhcpc quit; a scan that fails leaves the
	// DHCP client unknown, and says so.
	a = newFakeAgent()
	a.files["/etc/os-release"] = []byte("NAME=busybox\n")
	a.scripts[dhcpScanScript] = func([]string) qmp.ExecStatus { return ok("") }
	f, err = ReadFacts(t.Context(), a, nil)
	if err != nil || f.Date != "busybox" || f.DHCP == nil || len(f.DHCP.Clients) != 0 || f.DHCP.arg() != "0" || f.SSH == nil || len(f.SSH.Types) != 0 {
		t.Errorf("busybox guest: %+v, %v", f, err)
	}
	a.scripts[dhcpScanScript] = func([]string) qmp.ExecStatus { return qmp.ExecStatus{Exited: true, ExitCode: 2} }
	f, err = ReadFacts(t.Context(), a, nil)
	if err == nil || !strings.Contains(err.Error(), "DHCP client") || f.DHCP != nil || f.NIC == nil {
		t.Errorf("failed scan: %+v, %v", f, err)
	}
	if (*DHCPFacts)(nil).arg() != "-" {
		t.Error("unknown DHCP client is not -")
	}
}

// countIfaces counts the interface lists a chain asks the agent for.
type countIfaces struct {
	*hostAgent
	n int
}

func (c *countIfaces) NetworkInterfaces(ctx context.Context) ([]qmp.NetworkInterface, error) {
	c.n++
	return c.hostAgent.NetworkInterfaces(ctx)
}

// With facts, the network step takes the NIC and the DHCP client from them
// (no interface list, no /proc scan) once the guest agrees: the client runs
// under its name and the NIC has the MAC. A client that is not what the
// facts say sends the step back to its scan; a NIC with another MAC fails
// it before anything changed.
func TestNetworkFromFacts(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		nicTree(g, "10.0.2.16/24")
		g.file("/sys/class/net/vmfk-test0/address", "52:54:00:00:00:01\n")
		// What the source ran: dhclient, pid 99999991. Its cmdline file
		// is missing, so only the facts can say how it ran.
		g.file("/proc/99999991/comm", "dhclient\n")
		g.file("/proc/99999991/exe", "")
		// What a scan would find instead.
		g.file("/proc/99999993/comm", "udhcpc\n")
		g.file("/proc/99999993/cmdline", "udhcpc\x00-i\x00vmfk-test0\x00")
		g.file("/proc/99999993/exe", "")
		g.stub("dhclient", "")
		g.stub("udhcpc", "")
		g.dir("/sbin")
		os.Symlink(filepath.Join(g.bin, "dhclient"), g.root+"/sbin/dhclient")
		facts := &Facts{
			NIC:  &NICFacts{Name: testNIC, MAC: "52:54:00:00:00:01"},
			DHCP: &DHCPFacts{Clients: []DHCPClient{{99999991, "dhclient"}}, Cmdline: dhclientCmd},
		}
		run := func(f *Facts) (*Result, int, error) {
			a := &countIfaces{hostAgent: netAgent("10.0.2.16/24")}
			env := g.env(sh, a.hostAgent)
			env.Agent, env.Facts = a, f
			res, err := Run(t.Context(), NewChain(NetworkStep(NetworkSpec{})), env)
			return res, a.n, err
		}
		res, lists, err := run(facts)
		if err != nil {
			t.Fatalf("%v\n%s", err, g.calls())
		}
		d := res.Steps[0].Detail
		if !strings.Contains(d, "dhclient (pid 99999991) stopped without a release") || !strings.Contains(d, "dhclient restarted as it ran ("+g.root+strings.Join(dhclientCmd, " ")+")") {
			t.Errorf("with facts: detail %q", d)
		}
		if lists != 1 {
			t.Errorf("with facts: %d interface lists, want only the one for the new addresses", lists)
		}

		// A stale fact (the pid is another program now): the scan finds
		// the udhcpc.
		os.Remove(g.log)
		g.file("/proc/99999991/comm", "bash\n")
		res, _, err = run(facts)
		if err != nil {
			t.Fatalf("stale: %v\n%s", err, g.calls())
		}
		if d := res.Steps[0].Detail; !strings.Contains(d, "udhcpc (pid 99999993) stopped") || !strings.Contains(d, "udhcpc restarted as it ran (udhcpc -i vmfk-test0)") {
			t.Errorf("stale facts: detail %q", d)
		}
		// Without facts the same.
		os.Remove(g.log)
		res, lists, err = run(nil)
		if err != nil || !strings.Contains(res.Steps[0].Detail, "udhcpc (pid 99999993) stopped") || lists != 2 {
			t.Errorf("no facts: %v, %d interface lists, %+v", err, lists, res.Steps)
		}

		// The NIC's MAC is not the facts': nothing is changed.
		os.Remove(g.log)
		g.file("/sys/class/net/vmfk-test0/address", "52:54:00:00:00:99\n")
		_, _, err = run(facts)
		want := `step "vmfork.network": the guest's vmfk-test0 has MAC 52:54:00:00:00:99, not 52:54:00:00:00:01 as in its source just before the freeze: the source changed its network while it was forked; fork it again`
		if err == nil || err.Error() != want {
			t.Errorf("other MAC:\n got %v\nwant %s", err, want)
		}
		if c := g.calls(); strings.Contains(c, "ip ") || strings.Contains(c, "LINK up") {
			t.Errorf("other MAC: the step changed something:\n%s", c)
		}
	})
}

// With facts, the clock and SSH steps read nothing in the child.
func TestClockAndSSHFromFacts(t *testing.T) {
	a := newFakeAgent()
	now := a.clock.Add(5 * time.Second)
	env := &Env{Agent: a, Facts: &Facts{Date: "busybox", SSH: &SSHFacts{}}, Child: testChild(1), Now: func() time.Time { return now }}
	res, err := Run(t.Context(), NewChain(ClockStep(), SSHHostKeysStep()), env)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range a.calls {
		if strings.HasPrefix(c, "read ") {
			t.Errorf("read %s in the child, which the facts said", c)
		}
	}
	if res.Steps[1].Status != StatusSkipped || !strings.Contains(res.Steps[0].Detail, "guest-set-time") {
		t.Errorf("steps %+v", res.Steps)
	}
}

// On a guest with GNU date (by its facts) the clock's date -s is a part of
// the batch after it, not a command of its own; a date that fails there
// falls back to guest-set-time.
func TestClockInTheBatch(t *testing.T) {
	for _, dateWorks := range []bool{true, false} {
		a := newFakeAgent()
		now := a.clock.Add(5 * time.Second)
		a.scripts[dateScript] = func(args []string) qmp.ExecStatus {
			if !dateWorks {
				return ok("failed\n")
			}
			var sec float64
			if _, err := fmt.Sscanf(args[0], "%g seconds", &sec); err != nil {
				t.Errorf("date -s %q: %v", args[0], err)
			}
			a.clock = a.clock.Add(time.Duration(sec * float64(time.Second)))
			return ok("")
		}
		a.scripts[hostnameScript] = func([]string) qmp.ExecStatus { return ok("web-1") }
		env := &Env{Agent: a, Facts: &Facts{Date: "gnu"}, Child: testChild(1), Now: func() time.Time { return now }}
		res, err := Run(t.Context(), NewChain(ClockStep(), HostnameStep("web-{n}")), env)
		if err != nil {
			t.Fatalf("date works %v: %v", dateWorks, err)
		}
		calls := strings.Join(a.calls, "\n")
		if !strings.Contains(calls, "batch clock,hostname") || strings.Contains(calls, "/bin/date") {
			t.Errorf("date works %v: calls\n%s", dateWorks, calls)
		}
		want := "by date -s, now +0ms from host (1 attempt)"
		if !dateWorks {
			want = "by guest-set-time, now +0ms from host (1 attempt)"
		}
		if d := res.Steps[0].Detail; !strings.HasSuffix(d, want) || !strings.HasPrefix(d, "stepped +5.000s") {
			t.Errorf("date works %v: detail %q, want it to end %q", dateWorks, d, want)
		}
		if a.clock != now {
			t.Errorf("date works %v: guest clock %v, want %v", dateWorks, a.clock, now)
		}
	}
}
