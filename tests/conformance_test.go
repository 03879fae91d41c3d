//go:build integration

package tests

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// conformanceDrivers are the drivers the suite runs on, each selected by CLI
// flags only; the suite sees nothing else of it.
var conformanceDrivers = []struct {
	name string
	args []string
}{
	{"qemu", nil},
	{"libvirt", []string{"--connect", libvirtURI}},
}

// TestConformance runs the one suite every driver must pass, once per driver
// (the embedded QEMU driver and libvirt), on the busybox test guest.
func TestConformance(t *testing.T) {
	parallelParent(t) // heavy and self-contained (tests/doc.go, "Parallel")
	for _, drv := range conformanceDrivers {
		t.Run(drv.name, func(t *testing.T) {
			parallel(t) // each driver its own env (tests/doc.go, "Parallel")
			conformance(t, newDriverEnv(t, drv.args), busyboxConformance)
		})
	}
}

// TestConformanceDebian runs the same suite on the stock Debian 12 guest
// (systemd, ifupdown and dhclient, no dbus: the minimal server install the
// identity work started from), for both drivers. The guest has nothing of
// vmfork's: the counter is a shell loop started through the agent.
//
// Under the embedded driver the suite's source is a child of the shared
// Debian template (tests/doc.go), which that driver booted: a Debian boot
// under TCG costs ten times a fork. libvirt boots its own: an archive
// imports under the driver it was exported with only.
func TestConformanceDebian(t *testing.T) {
	parallelParent(t) // heavy and self-contained (tests/doc.go, "Parallel")
	deb := debianGuest(t)
	v := deb.variant(t, "ifupdown-nodbus")
	g := conformanceGuest{
		memoryMiB: 512,
		boot: func(d *driverEnv, name string) machineJSON {
			var m machineJSON
			if d.driver == "qemu" {
				m = d.forkDebian(name)
			} else {
				d.cliJSON(&m, "--timeout", debianBootTimeout.String(), "boot", name, "--kernel", deb.Kernel,
					"--initrd", deb.Initrd, "--disk", deb.Disk, "--append", v.Append, "--memory", debianMemory)
			}
			// Forked once systemd is up, as users fork a machine they
			// warmed; is-system-running --wait is bounded in the guest.
			r := d.cli("--timeout", "5m", "exec", name, "--", "timeout", "240", "systemctl", "is-system-running", "--wait")
			if st := strings.TrimSpace(r.stdout); st != "running" && st != "degraded" {
				d.t.Fatalf("%s: systemd did not finish booting: %s", name, r)
			}
			return m
		},
		release: func(d *driverEnv) {
			if d.debianImported {
				d.cliOK("template", "rm", debianBase)
			}
		},
		startCounter: func(d *driverEnv, name string) string { return d.run(name, "sh", "-c", shellCounter) },
	}
	for _, drv := range conformanceDrivers {
		t.Run(drv.name, func(t *testing.T) {
			parallel(t) // each driver its own env (tests/doc.go, "Parallel")
			conformance(t, newDriverEnvGuest(t, drv.args, deb.guest), g)
		})
	}
}

// conformanceGuest is what the suite needs to know of a guest.
type conformanceGuest struct {
	memoryMiB int
	boot      func(d *driverEnv, name string) machineJSON
	// release, if set, gives up what boot kept in the store besides the
	// machine (the shared template a child was forked from), once the
	// source is removed: the suite then finds the store empty.
	release func(d *driverEnv)
	// startCounter starts a process that writes the next number to
	// /run/counter every 0.2 s, its PID in /run/counter.pid, and prints
	// the PID.
	startCounter func(d *driverEnv, name string) string
	// coldStart: the Start behaviour runs (vmfork start boots a stopped
	// child again). A cold boot of the busybox guest costs seconds; of the
	// Debian guest, 35-40 s of TCG CPU per driver, more than the suite may
	// spend.
	coldStart bool
}

var busyboxConformance = conformanceGuest{
	memoryMiB:    256,
	boot:         func(d *driverEnv, name string) machineJSON { return d.bootGuest(name) },
	startCounter: func(d *driverEnv, name string) string { return d.run(name, "vmfork-counter", "start") },
	coldStart:    true,
}

// guestIdentity prints what makes a guest the machine it is: its hostname,
// its NIC's MAC and its machine-id.
const guestIdentity = "hostname; cat /sys/class/net/e*/address /etc/machine-id"

// shellCounter is the busybox guest's vmfork-counter in plain sh, for guests
// that have nothing of vmfork's. Detached from the agent's pipes (guest-exec
// waits for their EOF); the file is replaced with mv so a reader never sees
// it empty.
const shellCounter = `setsid sh -c 'echo $$ > /run/counter.pid; n=0
while :; do n=$((n + 1)); echo $n > /run/counter.tmp && mv -f /run/counter.tmp /run/counter; sleep 0.2; done' </dev/null >/dev/null 2>&1 &
i=0; until [ -s /run/counter.pid ] && [ -s /run/counter ]; do i=$((i + 1)); [ $i -le 50 ] || exit 1; sleep 0.1; done
cat /run/counter.pid`

// conformance is the suite. Its behaviours run in order on one source
// machine (booting a guest under TCG takes seconds), each as a subtest; once
// one fails, the rest would only repeat its failure and are not run.
func conformance(t *testing.T, d *driverEnv, g conformanceGuest) {
	src := d.n("src")
	kids := []string{src + "-1", src + "-2", src + "-3"}
	grandchild := d.n("grandchild")
	var tpl string
	var stoppedID string      // kids[2]'s guest identity when it was stopped
	var stoppedAs machineJSON // and its record
	steps := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"Boot", func(t *testing.T) {
			m := g.boot(d, src)
			if m.Name != src || m.State != "running" || m.MemoryMiB != g.memoryMiB || m.CPUs != 1 {
				t.Errorf("boot = %+v, want %s running with %d MiB and 1 CPU", m, src, g.memoryMiB)
			}
			ls := d.machines()[src]
			if got := d.driverOf(src); ls.State != "running" || got != d.driver {
				t.Errorf("ls = %+v under driver %q, want running under driver %q", ls, got, d.driver)
			}
			if !exists(ls.Serial) || !exists(ls.Disk) {
				t.Errorf("serial log %q or disk %q missing", ls.Serial, ls.Disk)
			}
		}},
		{"Exec", func(t *testing.T) {
			if got := strings.TrimSpace(d.run(src, "uname", "-r")); got != d.guest.KernelRelease {
				t.Errorf("uname -r = %q, want %q", got, d.guest.KernelRelease)
			}
			r := d.cli("exec", src, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
			if r.code != 3 || r.stdout != "out\n" || r.stderr != "err\n" {
				t.Errorf("exec = %s, want exit 3, out\\n, err\\n", r)
			}
			if r := d.cliOK("exec", src, "--stdin", "--", "cat"); r.stdout != "" {
				t.Errorf("cat with empty stdin printed %q", r.stdout)
			}
		}},
		{"Fork", func(t *testing.T) {
			pid := strings.TrimSpace(g.startCounter(d, src))
			time.Sleep(time.Second)
			before := d.count(src)
			var res forkJSON
			d.cliJSON(&res, "fork", src, "--count", "3")
			after := d.count(src)
			if len(res.Children) != 3 || len(res.Failed) != 0 || res.PauseMS <= 0 {
				t.Fatalf("fork = %+v, want 3 children and a measured pause", res)
			}
			tpl = res.Template
			for i, c := range res.Children {
				if c.Name != kids[i] || c.State != "running" || c.ReadyMS <= 0 {
					t.Errorf("child %d = %+v, want %s running", i, c, kids[i])
				}
			}
			for _, k := range kids {
				if got := strings.TrimSpace(d.run(k, "cat", "/run/counter.pid")); got != pid {
					t.Errorf("%s: counter pid %s, want the source's %s", k, got, pid)
				}
				// It continued from the fork point: not restarted, not from
				// the future.
				if c := d.count(k); c < before || c > after+50 {
					t.Errorf("%s: counter %d, want it to continue from %d..%d", k, c, before, after)
				}
			}
			c := d.count(src)
			time.Sleep(1200 * time.Millisecond)
			if got := d.count(src); got <= c {
				t.Errorf("source counter stuck at %d after the fork", got)
			}
			for _, m := range kids {
				if got := d.machines()[m]; got.Parent != src || got.Template != tpl {
					t.Errorf("ls: %s parent/template = %q/%q, want %s/%s", m, got.Parent, got.Template, src, tpl)
				}
			}
		}},
		{"Identity", func(t *testing.T) {
			// Children share the source's RNG state at the fork; the new
			// vmgenid each one gets makes its kernel reseed.
			seen := map[string]string{}
			for _, m := range append([]string{src}, kids...) {
				r := strings.TrimSpace(d.run(m, "sh", "-c", "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'"))
				if len(r) != 32 {
					t.Fatalf("%s: urandom read %q", m, r)
				}
				if other, dup := seen[r]; dup {
					t.Errorf("%s and %s read the same urandom bytes %s", m, other, r)
				}
				seen[r] = m
			}
		}},
		{"ForkOfFork", func(t *testing.T) {
			// A child maps its template privately: its fork freezes what it
			// wrote since, and still continues from the instant.
			d.run(kids[0], "sh", "-c", "echo grand > /run/mark")
			d.cliOK("fork", kids[0], grandchild)
			want := d.run(kids[0], "cat", "/run/counter.pid") + "grand\n"
			if got := d.run(grandchild, "cat", "/run/counter.pid", "/run/mark"); got != want {
				t.Errorf("grandchild sees %q, want %q", got, want)
			}
		}},
		{"Stop", func(t *testing.T) {
			if g.coldStart {
				// What Start checks it keeps: written to its disk (/data,
				// the busybox guest's data disk) and synced before the kill.
				stoppedID = d.run(kids[2], "sh", "-c", guestIdentity+"; echo start-mark >/data/start-mark && sync")
				stoppedAs = d.machines()[kids[2]]
			}
			d.cliOK("stop", kids[2], "--force")
			if m := d.machines()[kids[2]]; m.State != "stopped" {
				t.Errorf("ls after stop: %s is %q, want stopped", kids[2], m.State)
			}
			if r := d.cli("exec", kids[2], "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "not running") {
				t.Errorf("exec on a stopped child: %s, want an error saying it is not running", r)
			}
			d.run(kids[1], "true") // its siblings run on
		}},
		{"Start", func(t *testing.T) {
			if !g.coldStart {
				t.Skip("a cold boot of this guest costs more than the suite may spend; Start runs on the busybox guest")
			}
			// The child stopped above boots again from its own disk as the
			// same machine: name, MAC, hostname, machine-id, disk contents.
			k := kids[2]
			if m := d.machines()[k]; m.StopReason != "user" {
				t.Errorf("ls: %s stopped with reason %q, want user", k, m.StopReason)
			}
			var plan struct {
				DryRun bool `json:"dry_run"`
			}
			d.cliJSON(&plan, "start", k, "--dry-run")
			if m := d.machines()[k]; !plan.DryRun || m.State != "stopped" {
				t.Errorf("start --dry-run: %+v, %s %s; want a dry run that leaves it stopped", plan, k, m.State)
			}
			var res []struct {
				Name  string `json:"name"`
				State string `json:"state"`
				MAC   string `json:"mac"`
			}
			d.cliJSON(&res, "start", k)
			m := d.machines()[k]
			if len(res) != 1 || res[0].Name != k || res[0].State != "running" || m.State != "running" {
				t.Fatalf("start = %+v, ls %+v; want %s running", res, m, k)
			}
			if m.MAC != stoppedAs.MAC || res[0].MAC != m.MAC || m.Hostname != stoppedAs.Hostname || m.Parent != src || m.Template != tpl || m.StopReason != "" {
				t.Errorf("ls after start: %+v, want it as it was: %+v", m, stoppedAs)
			}
			if got := d.run(k, "sh", "-c", guestIdentity+"; cat /data/start-mark"); got != stoppedID+"start-mark\n" {
				t.Errorf("%s after start: guest identity and disk mark %q, want %q", k, got, stoppedID+"start-mark\n")
			}
			if r := d.cli("start", k); r.code != 2 || !strings.Contains(r.stderr, "running already") {
				t.Errorf("start of a running machine: %s, want exit 2 saying it runs", r)
			}
			d.run(kids[1], "true") // its siblings ran on
		}},
		{"Remove", func(t *testing.T) {
			tplRAM := filepath.Join(d.memDir, tpl+".ram")
			d.cliOK(append([]string{"rm", grandchild}, kids...)...)
			if exists(tplRAM) || exists(filepath.Join(d.stateDir, "templates", tpl)) {
				t.Errorf("template %s still there after its last child was removed", tpl)
			}
			if got := d.count(src); got <= 0 {
				t.Errorf("source counter %d after its children went", got)
			}
			d.cliOK("rm", src)
			if g.release != nil {
				g.release(d)
			}
			for _, g := range []string{filepath.Join(d.stateDir, "machines", "*"), filepath.Join(d.stateDir, "templates", "*"), filepath.Join(d.memDir, "*")} {
				if left, _ := filepath.Glob(g); len(left) != 0 {
					t.Errorf("left after removing everything: %v", left)
				}
			}
			if left := d.leftovers(); len(left) != 0 {
				t.Errorf("still running after removing everything: %v", left)
			}
			if ms := d.machines(); len(ms) != 0 {
				t.Errorf("ls after rm = %v, want nothing", ms)
			}
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.fn) {
			t.Fatalf("%s failed; the later behaviours build on it", s.name)
		}
	}
}
