package customize

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vmfork/vmfork/qmp"
)

// Each process a part starts costs tens of milliseconds in a fresh child
// under TCG; these tests hold the ways the parts avoid them.

// An inline part runs in the batch's own shell (batch.go): it must leave
// that shell as it found it.
func TestInlinePartsLeaveTheShellAlone(t *testing.T) {
	forbidden := regexp.MustCompile(`(^|[\s;&|(])(exit|set -e|umask|trap|cd|export)($|[\s;])`)
	assigns := regexp.MustCompile(`(^|\s)[A-Za-z_][A-Za-z0-9_]*=`)
	for name, script := range map[string]string{"rng": rngScript, "hostname": hostnameScript, "machine-id": machineIDScript, "journald": journaldScript, "clock": dateScript} {
		if m := forbidden.FindString(script); m != "" {
			t.Errorf("%s: inline part uses %q", name, strings.TrimSpace(m))
		}
		if assigns.MatchString(script) && !strings.Contains(script, "local ") {
			t.Errorf("%s: inline part sets variables but declares no local ones", name)
		}
	}
	env := &Env{Child: testChild(1)}
	for _, s := range []Step{RNGStep(), HostnameStep("h{n}"), MachineIDStep()} {
		parts, err := s.Parts(t.Context(), env)
		if err != nil || len(parts) == 0 {
			t.Errorf("%s: parts %v (%v)", s.Name, parts, err)
		}
		for _, p := range parts {
			if !p.Inline {
				t.Errorf("%s: a part is not inline", s.Name)
			}
		}
	}
}

// Inline and subshell parts in one batch, on the host's dash and busybox
// sh: an inline part's locals, positional parameters and status stay its
// own, and a part that fails still ends the batch.
func TestInlinePartsInABatch(t *testing.T) {
	items := []batchItem{
		{part: &Part{Inline: true, Script: `local v=inline; set -- x y z; echo "$v $#"; return 100`, Args: []string{"a"}}},
		{part: &Part{Script: `echo "${v-unset} $# $1"; case $- in *e*) echo "set -e leaked" ;; esac`, Args: []string{"b"}}},
		{part: &Part{Inline: true, Script: `local w; w=$1; echo "$w"; false`, Args: []string{"c"}}},
		{part: &Part{Script: `echo never`}},
	}
	for _, sh := range hostShells(t) {
		status := filepath.Join(t.TempDir(), "status")
		script, args, _ := buildBatch(items, status)
		out, errs, code := runShell(t, sh, script, args...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", sh[0], code, errs)
		}
		got := parseBatch(len(items), []byte(out), []byte(errs))
		want := []struct {
			code int
			out  string
		}{{exitNothingToDo, "inline 3"}, {0, "unset 1 b"}, {1, "c"}}
		for i, w := range want {
			if !got[i].ran || got[i].code != w.code || strings.TrimSpace(got[i].stdout) != w.out {
				t.Errorf("%s: part %d: %+v, want code %d and %q", sh[0], i+1, got[i], w.code, w.out)
			}
		}
		if got[3].ran {
			t.Errorf("%s: a part ran after one failed", sh[0])
		}
	}
}

// The NIC goes down through sysfs (no ip process) where its flags file
// takes it, and the rest of the sequence is unchanged.
func TestNetworkDownThroughSysfs(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		nicTree(g, "10.0.2.16/24")
		g.file("/sys/class/net/vmfk-test0/flags", "0x1003\n")
		g.stub("udhcpc", `s=; while [ $# -gt 0 ]; do [ "$1" = -s ] && s=$2; shift; done; [ -x "$s" ]`)
		_, res, err := runOn(t, g, sh, netAgent("10.0.2.16/24"), NetworkStep(NetworkSpec{}))
		if err != nil {
			t.Fatalf("%v\n%s", err, g.calls())
		}
		calls := g.calls()
		if got := g.read("/sys/class/net/vmfk-test0/flags"); got != "4098\n" {
			t.Errorf("flags %q, want 4098 (0x1003 without IFF_UP)", got)
		}
		if strings.Contains(calls, "ip link set dev vmfk-test0 down") {
			t.Errorf("ip ran to take the link down:\n%s", calls)
		}
		mac := testChild(2).MAC
		if !before(calls, "ip -4 addr flush dev vmfk-test0", "ip link set dev vmfk-test0 address "+mac+" up") ||
			!before(calls, "ip link set dev vmfk-test0 address "+mac+" up", "LINK up") ||
			!strings.Contains(res.Steps[0].Detail, "udhcpc -q") {
			t.Errorf("detail %q, calls:\n%s", res.Steps[0].Detail, calls)
		}
	})
}

// A DHCP client started by name (not path) is found on PATH without a
// command substitution, restarted as it ran, and reported missing when it
// is gone; a /proc entry without exe (a kernel thread) is never taken for
// a client.
func TestNetworkClientStartedByName(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		nicTree(g, "10.0.2.16/24")
		argv := []string{"udhcpc", "-i", testNIC, "-n", "-q"}
		g.file("/proc/99999993/comm", "udhcpc\n")
		g.file("/proc/99999993/cmdline", strings.Join(argv, "\x00")+"\x00")
		g.file("/proc/99999993/exe", "")
		g.file("/proc/99999994/comm", "dhclient\n") // no exe: a kernel thread
		g.stub("udhcpc", "")
		_, res, err := runOn(t, g, sh, netAgent("10.0.2.16/24"), NetworkStep(NetworkSpec{}))
		if err != nil {
			t.Fatalf("%v\n%s", err, g.calls())
		}
		d := res.Steps[0].Detail
		if !strings.Contains(d, "udhcpc (pid 99999993) stopped without a release") ||
			!strings.Contains(d, "udhcpc restarted as it ran (udhcpc -i vmfk-test0 -n -q)") {
			t.Errorf("detail %q", d)
		}
		if !strings.Contains(g.calls(), "udhcpc -i vmfk-test0 -n -q") {
			t.Errorf("not restarted as it ran:\n%s", g.calls())
		}
		os.Remove(filepath.Join(g.bin, "udhcpc"))
		os.Remove(g.log)
		_, _, err = runOn(t, g, sh, netAgent(), NetworkStep(NetworkSpec{}))
		want := `step "vmfork.network": the guest has no udhcpc any more, the DHCP client (udhcpc) that configured vmfk-test0: install it (isc-dhcp-client for dhclient), set network.dhcp_command, use --network static or none, or --skip-step vmfork.network`
		if err == nil || err.Error() != want {
			t.Errorf("client gone:\n got %v\nwant %s", err, want)
		}
		if strings.Contains(g.calls(), "LINK up") {
			t.Errorf("the link went up for a client the guest lacks:\n%s", g.calls())
		}
	})
}

// iproute2's ip flushes and sets the new MAC in one process (-batch);
// busybox's ip, which has no -batch, and an ip whose batch fails get the
// two commands, in the same order.
func TestNetworkFlushAndMACInOneIP(t *testing.T) {
	mac := testChild(2).MAC
	flush, up := "ip -4 addr flush dev vmfk-test0", "ip link set dev vmfk-test0 address "+mac+" up"
	for _, c := range []struct {
		name  string
		setup func(g *guestTree)
		batch bool
	}{
		{"iproute2", func(*guestTree) {}, true},
		{"busybox", func(g *guestTree) {
			// ip is busybox (a link to it), as on the test guest.
			g.dir("/bin")
			if err := os.Link(filepath.Join(g.bin, "ip"), g.root+"/bin/busybox"); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"batch fails", func(g *guestTree) {
			g.stub("ip", `case "$*" in *-batch*) exit 1 ;; *"addr show"*) echo "2: vmfk-test0    inet 10.0.2.16/24 scope global vmfk-test0" ;; esac`)
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
				nicTree(g, "10.0.2.16/24")
				g.stub("udhcpc", `s=; while [ $# -gt 0 ]; do [ "$1" = -s ] && s=$2; shift; done; [ -x "$s" ]`)
				c.setup(g)
				if _, _, err := runOn(t, g, sh, netAgent("10.0.2.16/24"), NetworkStep(NetworkSpec{})); err != nil {
					t.Fatalf("%v\n%s", err, g.calls())
				}
				calls := g.calls()
				if strings.Contains(calls, "ip -4 -batch -") != c.batch {
					t.Errorf("ip -batch tried: %v, want %v:\n%s", !c.batch, c.batch, calls)
				}
				if !before(calls, flush, up) || !before(calls, up, "LINK up") {
					t.Errorf("%q, then %q, then the link, not in:\n%s", flush, up, calls)
				}
			})
		})
	}
}

// journald's restart (a Last part of vmfork.machine-id) runs at the end of
// the chain's last batch, after DHCP and the hooks, and its note joins the
// step's detail; a chain that fails before it never restarts journald.
func TestLastPartsRunAtTheEnd(t *testing.T) {
	a := newFakeAgent().guest()
	a.scripts[journaldScript] = func([]string) qmp.ExecStatus { return ok("systemd-journald restarting\n") }
	res, err := runSpec(t, Spec{Hostname: "web-{n}"}, a, testChild(2), &fakeLink{})
	if err != nil {
		t.Fatalf("Run = %v\ncalls:\n%s", err, a.callLog())
	}
	var batches []string
	for _, c := range a.calls {
		if b, ok := strings.CutPrefix(c, "batch "); ok {
			batches = append(batches, b)
		}
	}
	if len(batches) != 2 || !strings.HasSuffix(batches[1], ",hooks,journald") || strings.Contains(batches[0], "journald") {
		t.Errorf("batches %q, want journald last in the last one", batches)
	}
	for _, s := range res.Steps {
		if s.Name == StepMachineID && (s.Status != StatusOK || !strings.HasSuffix(s.Detail, "; systemd-journald restarting)")) {
			t.Errorf("machine-id step %+v", s)
		}
	}

	a = newFakeAgent().guest()
	a.scripts[netUpScript] = func([]string) qmp.ExecStatus {
		return qmp.ExecStatus{Exited: true, ExitCode: exitExplained, Stderr: []byte("no lease\n")}
	}
	if _, err := runSpec(t, Spec{Hostname: "web-{n}"}, a, testChild(2), &fakeLink{}); err == nil {
		t.Fatal("a failed DHCP part did not fail the chain")
	}
	if log := a.callLog(); strings.Contains(log, "run sh:journald") {
		t.Errorf("journald restarted after a failure:\n%s", log)
	}
}
