//go:build integration

package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLibvirtDiskPolicies is TestForkDiskPolicies and TestForkDiskOnly on
// the libvirt driver, on one source: a domain vmfork boots with OS + data
// (cow) + shared + scratch (fresh) + home (keep) disks forks live into
// three children, each a libvirt domain with every disk: the data disk
// holds the source's synced writes and a child's writes stay its own, the
// shared disk reads the same everywhere and takes no writes, scratch and
// home are empty in every child, and the source's keep disk keeps its
// data. Then a disk-only fork of the same running source: its vCPUs never
// stop (a serial ticker timed on the host shows no stall beyond the
// filesystem-freeze window), and its two children boot fresh from that
// view of all its disks. Last, a fork of the source stopped, and its
// restart, both from vmfork's record alone.
func TestLibvirtDiskPolicies(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	dir := t.TempDir()
	img := func(name string) string {
		p := filepath.Join(dir, name)
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", p, "1M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create %s: %v: %s", p, err, out)
		}
		return p
	}
	shared := filepath.Join(dir, "shared.raw")
	if err := os.WriteFile(shared, append([]byte("SHARED"), make([]byte, 1<<20-6)...), 0o644); err != nil {
		t.Fatal(err)
	}
	p := d.n("p")
	disks := []string{
		"--disk", "id=data,file=" + img("data.qcow2"),
		"--disk", "id=ro,file=" + shared + ",fork=shared",
		"--disk", "id=scratch,file=" + img("scratch.qcow2") + ",fork=fresh",
		"--disk", "id=home,file=" + img("home.qcow2") + ",fork=keep",
	}
	if out := d.cliOK(append([]string{"boot", p, "--kernel", d.guest.Kernel, "--initrd", d.guest.Initrd, "--disk", d.guest.Disk, "--dry-run"}, disks...)...).stdout; !strings.Contains(out, `attach disk "home": an overlay on`) || !strings.Contains(out, `driver "libvirt"`) {
		t.Errorf("boot --dry-run on libvirt does not say per disk what happens:\n%s", out)
	}
	src := d.bootGuest(p, disks...)
	// Every disk is in the domain, in the spec's order, each with its id
	// as its serial (what the guest sees in /sys/block/vdX/serial).
	const data, ro, scratch, home = "/dev/vdb", "/dev/vdc", "/dev/vdd", "/dev/vde"
	for dev, id := range map[string]string{data: "data", ro: "ro", scratch: "scratch", home: "home"} {
		if got := strings.TrimSpace(d.run(p, "cat", "/sys/block/"+strings.TrimPrefix(dev, "/dev/")+"/serial")); got != id {
			t.Errorf("%s's serial is %q, want %q", dev, got, id)
		}
	}
	write := func(m, dev, s string) {
		t.Helper()
		d.run(m, "sh", "-c", "dd if=/dev/zero of="+dev+" bs=16 count=1 conv=notrunc 2>/dev/null && printf "+s+" | dd of="+dev+" conv=notrunc 2>/dev/null && sync")
	}
	read := func(m, dev string) string {
		t.Helper()
		return strings.TrimSpace(d.run(m, "sh", "-c", "sync; echo 3 >/proc/sys/vm/drop_caches; dd if="+dev+" bs=16 count=1 2>/dev/null | tr -d '\\000'"))
	}
	write(p, data, "DATA-SRC")
	write(p, scratch, "SCRATCH-SRC")
	write(p, home, "HOME-SRC")
	if r := d.cli("exec", p, "--", "sh", "-c", "printf X | dd of="+ro+" conv=notrunc"); r.code == 0 {
		t.Errorf("the source wrote to its shared disk: %s", r)
	}
	if out := d.cliOK("fork", p, "--dry-run").stdout; !strings.Contains(out, `disk "data": cow, frozen in the same pause`) || !strings.Contains(out, `disk "home": keep`) || !strings.Contains(out, `disk "scratch": fresh`) {
		t.Errorf("fork --dry-run on libvirt does not say per disk what happens:\n%s", out)
	}

	// Bad disk lines on libvirt: one line, exit 2, before anything is
	// paused or made.
	domsBefore := strings.Join(domains(t, d.prefix), " ")
	runBadCases(t, d.env, []badCase{
		{"libvirt fork disk policy unknown disk", []string{"--connect", libvirtURI, "fork", p, "--disk-policy", "nope=fresh"}, 2, `no disk "nope" (the machine's disks: disk0, data, ro, scratch, home)`},
		{"libvirt fork shared disk made writable", []string{"--connect", libvirtURI, "fork", p, "--disk-policy", "ro=cow"}, 2, `disk "ro" is shared (read-only) and stays shared in children, not cow`},
		{"libvirt fork disk-only boot disk policy", []string{"--connect", libvirtURI, "fork", p, "--disk-only", "--disk-policy", "disk0=fresh"}, 2, `disk "disk0" is the boot disk, which forks cow, not fresh`},
		{"libvirt boot disk id twice", []string{"--connect", libvirtURI, "boot", d.n("bad"), "--kernel", d.guest.Kernel, "--disk", d.guest.Disk, "--disk", "id=data,file=" + shared, "--disk", "id=data,file=" + shared}, 2, `disk id "data" is given twice`},
	}, func(t *testing.T) {
		t.Helper()
		if got := strings.Join(domains(t, d.prefix), " "); got != domsBefore {
			t.Errorf("domains after bad input: %s, want %s", got, domsBefore)
		}
		if st := strings.TrimSpace(virshOK(t, "domstate", p)); st != "running" {
			t.Errorf("source domain state %q after bad input, want running", st)
		}
	})

	hook := filepath.Join(dir, "disk-env.sh")
	if err := os.WriteFile(hook, []byte("env | grep '^VMFORK_DISK_' | sort >/tmp/disk-env\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var res forkJSON
	live := watchLifecycle(t, p)
	d.cliJSON(&res, "fork", p, "--count", "3", "--extra-step", "vmforktest.disks="+hook)
	if len(res.Children) != 3 {
		t.Fatalf("fork = %+v, want three children", res)
	}
	// The watch's control: a live fork pauses the source, and the watch sees it.
	if ev := live.stop(); !strings.Contains(ev, "Suspended") {
		t.Errorf("libvirt's lifecycle events show no suspend of %s during its live fork (the watch sees nothing?):\n%s", p, ev)
	}
	kids := []string{res.Children[0].Name, res.Children[1].Name, res.Children[2].Name}
	for _, c := range kids {
		if got := read(c, data); got != "DATA-SRC" {
			t.Errorf("%s's cow disk reads %q, want the source's DATA-SRC", c, got)
		}
		if got := read(c, ro); got != "SHARED" {
			t.Errorf("%s's shared disk reads %q, want SHARED", c, got)
		}
		for _, dev := range []string{scratch, home} {
			if got := read(c, dev); got != "" {
				t.Errorf("%s's %s reads %q, want an empty disk", c, dev, got)
			}
		}
		if got := strings.Fields(d.run(c, "cat", "/tmp/disk-env")); strings.Join(got, " ") != "VMFORK_DISK_HOME=fresh VMFORK_DISK_SCRATCH=fresh" {
			t.Errorf("%s's hooks saw %q, want VMFORK_DISK_HOME=fresh VMFORK_DISK_SCRATCH=fresh", c, got)
		}
		// libvirt's view: every disk, the shared one read-only, the
		// others the child's own images.
		x := virshOK(t, "dumpxml", c)
		for _, id := range []string{"data", "ro", "scratch", "home"} {
			if !strings.Contains(x, "<serial>"+id+"</serial>") {
				t.Errorf("%s's domain XML has no disk %s", c, id)
			}
		}
		if strings.Count(x, "<readonly/>") != 1 || !strings.Contains(x, "<source file='"+shared+"'") {
			t.Errorf("%s's domain XML: want %s as its one read-only disk", c, shared)
		}
	}
	write(kids[0], data, "DATA-C1")
	write(kids[0], home, "HOME-C1")
	if r := d.cli("exec", kids[1], "--", "sh", "-c", "printf X | dd of="+ro+" conv=notrunc"); r.code == 0 {
		t.Errorf("a child wrote to the shared disk: %s", r)
	}
	for m, want := range map[string]string{kids[1]: "DATA-SRC", p: "DATA-SRC", kids[0]: "DATA-C1"} {
		if got := read(m, data); got != want {
			t.Errorf("%s's cow disk reads %q after %s wrote to its own, want %q", m, got, kids[0], want)
		}
	}
	if got := read(p, home); got != "HOME-SRC" {
		t.Errorf("the source's keep disk reads %q, want HOME-SRC", got)
	}
	if got := read(p, scratch); got != "SCRATCH-SRC" {
		t.Errorf("the source's fresh disk reads %q, want SCRATCH-SRC", got)
	}
	d.cliOK(append([]string{"rm", "-f"}, kids...)...)

	// Disk-only: no pause, the filesystems frozen for the switch.
	d.run(p, "vmfork-counter", "start")
	d.run(p, "sh", "-c", "echo synced >/data/synced.txt && sync && echo unsynced >/data/unsynced.txt")
	write(p, data, "DATA-DO")
	d.run(p, "sh", "-c", `setsid sh -c 'while :; do echo vmfork-tick; usleep 20000; done >/dev/ttyS0 2>&1' </dev/null >/dev/null 2>&1 &`)
	ticks := followTicks(t, src.Serial)
	time.Sleep(500 * time.Millisecond)
	c0 := d.count(p)
	if out := d.cliOK("fork", p, "--disk-only", "--dry-run").stdout; !strings.Contains(out, `disk "data": cow, switched in the same transaction, under the filesystem freeze`) {
		t.Errorf("fork --disk-only --dry-run does not say how the disks switch:\n%s", out)
	}
	var do struct {
		forkJSON
		DiskOnly   bool    `json:"disk_only"`
		FSFrozenMS float64 `json:"fs_frozen_ms"`
	}
	events := watchLifecycle(t, p)
	start := time.Now()
	r := d.cliOK("fork", p, "--disk-only", "--count", "2", "--prefix", p+"-do", "--json")
	end := time.Now()
	// The vCPUs never stopped: libvirt reports every suspend of the domain.
	if ev := events.stop(); strings.Contains(ev, "Suspended") {
		t.Errorf("the source was suspended during its disk-only fork:\n%s", ev)
	}
	if err := json.Unmarshal([]byte(r.stdout), &do); err != nil {
		t.Fatalf("fork --json: %v\n%s", err, r.stdout)
	}
	gap, n := ticks.maxGap(start, end)
	t.Logf("libvirt disk-only fork: %.0f ms in all, filesystems frozen %.1f ms; source's serial ticker: %d ticks, longest gap %v",
		ms(end.Sub(start)), do.FSFrozenMS, n, gap.Round(time.Millisecond))
	if !do.DiskOnly || do.PauseMS != 0 || do.FSFrozenMS <= 0 || len(do.Children) != 2 {
		t.Fatalf("fork result %+v: want disk-only, no pause, a freeze window, 2 children", do)
	}
	// The children's cold boots load the host, so a tick may come late (a
	// loaded CI host stalled one 2.3 s): the lifecycle events above say
	// whether the vCPUs stopped; the ticker catches a guest that hung.
	if n == 0 || gap > time.Duration(do.FSFrozenMS)*time.Millisecond+5*time.Second {
		t.Errorf("the source's ticker stalled %v (%d ticks) during the fork, over the %.1f ms freeze window + 5 s", gap, n, do.FSFrozenMS)
	}
	if c1 := d.count(p); c1 <= c0 {
		t.Errorf("the source's counter went from %d to %d across the fork, want it to run on", c0, c1)
	}
	if st := strings.TrimSpace(virshOK(t, "domstate", p)); st != "running" {
		t.Errorf("source domain state %q after the disk-only fork, want running", st)
	}
	d.run(p, "sh", "-c", "echo after >/data/after.txt && sync") // thawed
	for _, c := range do.Children {
		if got := strings.TrimSpace(d.run(c.Name, "cat", "/data/synced.txt", "/data/unsynced.txt")); got != "synced\nunsynced" {
			t.Errorf("child %s sees %q, want the source's files", c.Name, got)
		}
		if got := d.cli("exec", c.Name, "--", "test", "-e", "/run/counter"); got.code == 0 {
			t.Errorf("child %s has the source's /run/counter: it continued instead of booting", c.Name)
		}
		if got := d.cli("exec", c.Name, "--", "test", "-e", "/data/after.txt"); got.code == 0 {
			t.Errorf("child %s sees the source's write after the fork", c.Name)
		}
		for dev, want := range map[string]string{data: "DATA-DO", ro: "SHARED", scratch: "", home: ""} {
			if got := read(c.Name, dev); got != want {
				t.Errorf("disk-only child %s's %s reads %q, want %q", c.Name, dev, got, want)
			}
		}
	}
	d.cliOK("rm", "-f", do.Children[0].Name, do.Children[1].Name)
	if os.Getenv("VMFORK_DISKONLY_COMPARE") != "" {
		// For docs/BENCHMARKS.md, off in CI: a live fork of the same
		// source, its pause and the ticker's longest gap.
		var live forkJSON
		start := time.Now()
		d.cliJSON(&live, "fork", p, "--count", "1", "--prefix", p+"-live")
		end := time.Now()
		gap, n := ticks.maxGap(start, end)
		t.Logf("libvirt live fork: %.0f ms in all, pause_ms %.1f; source's serial ticker: %d ticks, longest gap %v",
			ms(end.Sub(start)), live.PauseMS, n, gap.Round(time.Millisecond))
		d.cliOK("rm", "-f", live.Children[0].Name)
	}
	// A stopped source's child boots from its record (BootXML) with
	// every disk by its policy, and the source starts again on its
	// own disks, its keep disk as it was.
	d.cliOK("stop", p)
	var st forkJSON
	d.cliJSON(&st, "fork", p, "--count", "1", "--prefix", p+"-st")
	for dev, want := range map[string]string{data: "DATA-DO", ro: "SHARED", scratch: "", home: ""} {
		if got := read(st.Children[0].Name, dev); got != want {
			t.Errorf("stopped source's child %s's %s reads %q, want %q", st.Children[0].Name, dev, got, want)
		}
	}
	d.cliOK("rm", "-f", st.Children[0].Name)
	d.cliOK("start", p)
	for dev, want := range map[string]string{data: "DATA-DO", home: "HOME-SRC", scratch: "SCRATCH-SRC"} {
		if got := read(p, dev); got != want {
			t.Errorf("after a restart the source's %s reads %q, want %q", dev, got, want)
		}
	}
}

// lifecycleWatch is `virsh event --event lifecycle` on one domain, running
// until stop, which returns what it printed.
type lifecycleWatch struct {
	cmd *exec.Cmd
	out *syncBuffer
}

// watchLifecycle starts watching domain's lifecycle events (suspended,
// resumed, ...), once virsh has registered for them.
func watchLifecycle(t *testing.T, domain string) *lifecycleWatch {
	t.Helper()
	w := &lifecycleWatch{out: &syncBuffer{}}
	w.cmd = exec.Command("virsh", "-c", libvirtURI, "event", "--domain", domain, "--event", "lifecycle", "--loop", "--timeout", "600")
	w.cmd.Stdout, w.cmd.Stderr = w.out, w.out
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("virsh event: %v", err)
	}
	t.Cleanup(func() { w.stop() })
	// virsh connects and registers before it waits; a second is ample
	// (it prints nothing until an event comes).
	time.Sleep(time.Second)
	return w
}

func (w *lifecycleWatch) stop() string {
	if w.cmd.ProcessState == nil {
		time.Sleep(300 * time.Millisecond) // events of the last moment
		w.cmd.Process.Kill()
		w.cmd.Wait()
	}
	return w.out.String()
}

// syncBuffer is a bytes.Buffer a process writes to while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
