//go:build integration

package tests

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
)

// TestCrashMatrixLibvirt is the crash matrix's libvirt part
// (docs/RELIABILITY.md): vmfork --connect is killed with SIGKILL at the
// fork's points that matter most on libvirt, crashRuns() times each: with
// children's records made, with the source suspended through libvirt, with
// the source resumed and no child started, and with children's domains
// running before their identity (also with a child's QEMU killed there
// instead), with a disk-only fork's guest filesystems frozen, and at rm's
// two points on a child. After the next command (ls) repaired what
// it found: the source's domain runs (virsh domstate) and its counter goes
// on, every domain of the test is a machine ls lists and every running
// machine has its domain, no child is listed running without its own
// hostname, no journal entry or stray file is left, every disk checks
// clean and no template file changed. A few points only: each run starts
// libvirt domains under TCG.
func TestCrashMatrixLibvirt(t *testing.T) {
	parallel(t) // heavy and self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	r := &rig{env: d.env, t: t, faultBin: failpointsBin(t)}
	src := d.n("src")
	// Extra disks (a cow one holding data, a fresh one): every fork below
	// switches two disks in its snapshot, and the repairs must leave the
	// source on the tops its QEMU holds (xdisk-<id>.N.qcow2).
	dir := t.TempDir()
	var extra []string
	for _, x := range []string{"more", "scratch"} {
		f := filepath.Join(dir, x+".qcow2")
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", f, "1M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create %s: %v: %s", f, err, out)
		}
		extra = append(extra, "--disk", "id="+x+",file="+f)
	}
	extra[len(extra)-1] += ",fork=fresh"
	d.bootGuest(src, extra...)
	const readMore = "sync; echo 3 >/proc/sys/vm/drop_caches; dd if=/dev/vdb bs=16 count=1 2>/dev/null | tr -d '\\000'"
	d.run(src, "sh", "-c", "printf MORE-SRC | dd of=/dev/vdb conv=notrunc 2>/dev/null && sync")
	d.run(src, "vmfork-counter", "start")
	runs := crashRuns(t)
	fork := func() []string { return []string{"fork", src, "--count", "2", "--prefix", d.n("k")} }
	// rm of a child made for the run.
	rm := func() []string {
		var res forkJSON
		d.cliJSON(&res, "fork", src, "--count", "1", "--prefix", d.n("gone"))
		return []string{"rm", res.Children[0].Name}
	}
	cases := []struct {
		fault string
		prep  func() []string
	}{
		{vmfork.FaultForkReserved, fork},
		{vmfork.FaultFreezePaused, fork},
		{vmfork.FaultForkFrozen, fork},
		{vmfork.FaultForkRunning, fork},
		{vmfork.FaultForkRunning + ":qemu", fork}, // a child's QEMU dies; vmfork carries on
		// fork --disk-only killed with the guest's filesystems frozen
		// through libvirt's agent passthrough: the repair thaws them.
		{vmfork.FaultDiskOnlyFrozen, func() []string { return []string{"fork", src, "--disk-only", "--count", "2", "--prefix", d.n("do")} }},
		{vmfork.FaultRmStopped, rm},
		{vmfork.FaultRmRemoving, rm},
	}
	only := regexp.MustCompile(os.Getenv("VMFORK_CRASH_CASES")) // as TestCrashMatrix: a regexp on the fault
	for _, c := range cases {
		if !only.MatchString(c.fault) {
			continue
		}
		self := !strings.HasSuffix(c.fault, ":qemu")
		start := time.Now()
		for i := 1; i <= runs; i++ {
			label := fmt.Sprintf("libvirt %s run %d", c.fault, i)
			args := c.prep()
			sums := r.templateSums()
			before := d.count(src)
			res, killed := r.faulted(c.fault, append(slices.Clone(d.args), args...)...)
			if killed != self {
				t.Fatalf("%s: vmfork killed %v, want %v: %s", label, killed, self, res)
			}
			d.checkCrash(r, label, src, before, sums)
			if c.fault == vmfork.FaultDiskOnlyFrozen {
				// A frozen /data would block this write past the timeout.
				if res := d.cli("--timeout", "30s", "exec", src, "--", "sh", "-c", "echo thawed >/data/thawed && sync"); res.code != 0 {
					t.Errorf("%s: a write in the source: %s; want its filesystems thawed", label, res)
				}
			}
			for name := range d.machines() {
				if args[0] == "rm" && name == args[1] {
					t.Errorf("%s: a killed rm of %s left it listed", label, name)
				}
				if name != src {
					d.cliOK("rm", name)
				}
			}
			if t.Failed() {
				t.Fatalf("%s failed; stopping the matrix", label)
			}
		}
		// The source forks as before once the debris is repaired.
		c2 := d.n("after")
		d.cliOK("fork", src, c2)
		if h := strings.TrimSpace(d.run(c2, "hostname")); h != c2 {
			t.Errorf("fork after the %s repairs: child %s has hostname %q", c.fault, c2, h)
		}
		for _, m := range []string{src, c2} {
			if got := strings.TrimSpace(d.run(m, "sh", "-c", readMore)); got != "MORE-SRC" {
				t.Errorf("after the %s repairs: %s's extra disk reads %q, want MORE-SRC", c.fault, m, got)
			}
		}
		d.cliOK("rm", c2)
		t.Logf("case libvirt %s: %d runs repaired (%v)", c.fault, runs, time.Since(start).Round(time.Second))
	}
}

// checkCrash runs ls (which repairs) and checks the libvirt matrix's
// invariants.
func (d *driverEnv) checkCrash(r *rig, label, src string, before int, sums map[string]string) {
	t := r.t
	t.Helper()
	ms := d.machines()
	if m, ok := ms[src]; !ok || m.State != "running" {
		t.Fatalf("%s: source %s = %+v, want running", label, src, m)
	}
	// 0 paused sources: libvirt's view, not only vmfork's record.
	if st := strings.TrimSpace(virshOK(t, "domstate", src)); st != "running" {
		t.Errorf("%s: virsh domstate %s = %q, want running", label, src, st)
	}
	// The counter ticks every 0.2 s; a source the repair just resumed needs
	// a moment.
	got := d.count(src)
	for deadline := time.Now().Add(10 * time.Second); got <= before && time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		got = d.count(src)
	}
	if got <= before {
		t.Errorf("%s: source counter %d, want more than %d before the kill", label, got, before)
	}
	// 0 leaked domains: virsh list --all against ls.
	doms := domains(t, d.prefix)
	for _, n := range doms {
		if _, ok := ms[n]; !ok {
			t.Errorf("%s: domain %s is no machine ls lists", label, n)
		}
	}
	for name, m := range ms {
		if m.State == "creating" {
			t.Errorf("%s: after the repair %s is still creating", label, name)
		}
		if m.State != "running" {
			continue
		}
		if !slices.Contains(doms, name) {
			t.Errorf("%s: %s is listed running but has no domain", label, name)
		}
		// 0 half-made children listed as running.
		if m.Parent != "" {
			if h := strings.TrimSpace(d.run(name, "hostname")); h != name {
				t.Errorf("%s: child %s runs with hostname %q, want its own name", label, name, h)
			}
		}
	}
	r.checkDisks(label)
	for path, want := range sums {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			continue // freed once no child maps it
		}
		if got := fileSHA256(t, path); got != want {
			t.Errorf("%s: template file %s changed: sha256 %s, want %s", label, path, got, want)
		}
	}
	left, _ := filepath.Glob(filepath.Join(d.stateDir, "journal", "*"))
	tmps, _ := filepath.Glob(filepath.Join(d.memDir, ".*"))
	for _, f := range append(left, tmps...) {
		t.Errorf("%s: left behind: %s", label, f)
	}
}
