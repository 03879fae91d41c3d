//go:build integration

package tests

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// lvForkTrace forks src into child through libvirt and returns the freeze as
// the fork's --trace-json reports it and the fork's result.
func (d *driverEnv) lvForkTrace(src, child string) (traceEvent, forkJSON) {
	d.t.Helper()
	fz, res, _, _ := d.lvForkDebug(src, child)
	return fz, res
}

// lvForkDebug is lvForkTrace with the debug log, and what its child's
// "delta applied" line says (deltaAppliedOf).
func (d *driverEnv) lvForkDebug(src, child string) (traceEvent, forkJSON, deltaApplied, bool) {
	d.t.Helper()
	r := d.cliOK("--log-level", "debug", "fork", src, child, "--json", "--trace-json")
	var res forkJSON
	if err := jsonDecode(r.stdout, &res); err != nil || len(res.Children) != 1 {
		d.t.Fatalf("fork %s %s: %v: %s", src, child, err, r)
	}
	da, ok := deltaAppliedOf(r.stderr)
	return frozenEvent(d.t, r.stderr), res, da, ok
}

// failDeltaFork makes a delta fork of src fail inside the pause, after its
// delta was written: the fork fails naming the failure, the domain runs,
// and nothing of the fork is left in the mem dir.
func (d *driverEnv) failDeltaFork(src string) {
	d.t.Helper()
	before, _ := filepath.Glob(filepath.Join(d.memDir, "*"))
	f := d.withFailpoints()
	f.env = f.env.withEnv(freezeFailEnv + "=after-ram")
	if r := f.cli("fork", src, d.n("x")); r.code == 0 || !strings.Contains(r.stderr, "injected failure") {
		d.t.Fatalf("delta fork with a failure after its RAM step: %s, want it to fail naming the failure", r)
	}
	if st := strings.TrimSpace(virshOK(d.t, "domstate", src)); st != "running" {
		d.t.Errorf("source domain %q after a failed delta fork, want running", st)
	}
	after, _ := filepath.Glob(filepath.Join(d.memDir, "*"))
	hidden, _ := filepath.Glob(filepath.Join(d.memDir, ".*"))
	if len(after) != len(before) || len(hidden) != 0 {
		d.t.Errorf("a failed delta fork left RAM files: %v, was %v", append(after, hidden...), before)
	}
}

// TestLibvirtDeltaForks (issue 27) is TestDeltaForks on the libvirt driver:
// a source domain forked 5 times, every child kept, writing between the
// forks (a counter and a file per instant); a delta fork that fails in the
// pause between the 4th and 5th leaves nothing, and the 5th, whose last
// delta went with it, is tracked from a copy before its pause. The first template is the
// domain's own RAM file (libvirt's, by a second name); every later one is a
// delta on it, with its writes tracked: the pause writes only the pages
// written since the last delta, or since the private pages were copied
// before it. Every child (a
// libvirt domain remapped onto the base, the delta written into its QEMU
// before the device state loads) holds exactly its instant's memory, the
// mem dir holds the used RAM once plus the deltas, the base outlives its own
// template, and a fork of a delta template's child is a delta again.
func TestLibvirtDeltaForks(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	src := d.n("src")
	child := func(i int) string { return d.n("d" + strconv.Itoa(i)) }
	d.bootGuest(src)
	ident := domainOf(t, src)
	pid := strings.TrimSpace(d.run(src, "vmfork-counter", "start"))
	d.fill(src, "/run/fill", 24)
	const forks = 5
	sums := map[int]string{} // the file each instant wrote
	tpls := map[int]string{}
	var deltas, mapped int64
	for i := 1; i <= forks; i++ {
		n := strconv.Itoa(i)
		d.run(src, "sh", "-c", "echo "+n+" > /run/instant")
		sums[i] = d.fill(src, "/run/file-"+n, 1)
		if i == forks {
			d.failDeltaFork(src)
		}
		fz, res, da, applied := d.lvForkDebug(src, child(i))
		tpls[i] = res.Template
		if i > 1 {
			mapped += checkApplied(t, child(i), da, applied)
		}
		rec := d.templateRecord(res.Template)
		switch {
		case i == 1 && (fz.RAMMode != "first" || rec.RAMDelta != nil):
			t.Errorf("fork 1: RAM mode %s, delta %v; want first, a full file", fz.RAMMode, rec.RAMDelta)
		case i > 1 && (fz.RAMMode != "delta" || rec.RAMDelta == nil):
			t.Fatalf("fork %d: RAM mode %s, delta %+v; want a delta", i, fz.RAMMode, rec.RAMDelta)
		case i > 1 && *fz.PrecopiedBytes > 2*rec.RAMDelta.Bytes:
			// Before the pause: the last delta and the pages written
			// since, or the private pages (sharedmem/delta.go,
			// precopy), never the frozen file.
			t.Errorf("fork %d: %d bytes copied before the pause for a delta of %d; want at most the last delta and the pages written since", i, *fz.PrecopiedBytes, rec.RAMDelta.Bytes)
		case i > 1:
			deltas += rec.RAMDelta.Bytes
			// The domain's writes are tracked (userfaultfd injected
			// into libvirt's QEMU): the pause writes only the pages
			// written since the last delta (copied before the pause)
			// or, on the first delta and after the failed fork, whose
			// delta is gone, since the private pages were copied
			// before the pause (sharedmem/delta.go, precopy).
			if *fz.PausedCopyBytes >= rec.RAMDelta.Bytes || *fz.PrecopiedBytes == 0 {
				t.Errorf("fork %d: %d bytes written in the pause for a delta of %d, %d before it: the writes were not tracked", i, *fz.PausedCopyBytes, rec.RAMDelta.Bytes, *fz.PrecopiedBytes)
			}
			t.Logf("fork %d: delta %d KiB, %d KiB written in the pause, %d KiB before", i, rec.RAMDelta.Bytes>>10, *fz.PausedCopyBytes>>10, *fz.PrecopiedBytes>>10)
			if _, err := os.Stat(filepath.Join(d.memDir, res.Template+".ram")); !os.IsNotExist(err) {
				t.Errorf("delta template %s has a full RAM file (%v)", res.Template, err)
			}
		}
	}
	if got := domainOf(t, src); got != ident {
		t.Errorf("the source is another domain or process after its forks: %s, was %s", got, ident)
	}
	check := func(name string, i int) {
		t.Helper()
		// One exec for the instant, the counter's pid and every file's
		// sum ("-" for a file the guest does not have).
		script := "cat /run/instant /run/counter.pid; for k in $(seq " + strconv.Itoa(forks) + "); do " +
			"if [ -e /run/file-$k ]; then md5sum /run/file-$k | cut -d' ' -f1; else echo -; fi; done"
		got := strings.Fields(d.run(name, "sh", "-c", script))
		if len(got) != 2+forks {
			t.Fatalf("%s: %q", name, got)
		}
		if got[0] != strconv.Itoa(i) {
			t.Errorf("%s: /run/instant = %s, want %d", name, got[0], i)
		}
		if got[1] != pid {
			t.Errorf("%s: counter pid %s, want %s", name, got[1], pid)
		}
		for k := 1; k <= forks; k++ {
			switch sum := got[1+k]; {
			case k > i && sum != "-":
				t.Errorf("%s (instant %d) has /run/file-%d, written after its instant", name, i, k)
			case k <= i && sum != sums[k]:
				t.Errorf("%s: /run/file-%d is %s, not what instant %d wrote", name, k, sum, k)
			}
		}
	}
	for i := 1; i <= forks; i++ {
		check(child(i), i)
	}
	// The domains map the deltas' long runs into libvirt's QEMU (the
	// files handed over with add-fd, as the base is): sharedmem/overlay.go.
	if mapped == 0 {
		t.Error("no child of a delta template mapped any of its delta's pages: all copied")
	}
	// The mem dir: the domain's file (the first template, every delta's
	// base) once, and the deltas. Full copies would be forks × that file.
	total, byName := d.memDirBytes()
	base := byName[tpls[1]+".ram"]
	t.Logf("mem dir %d MiB: base %d MiB, deltas %d KiB in all (%d forks)", total>>20, base>>20, deltas>>10, forks)
	if base == 0 || total > base+deltas+(4<<20) || deltas > base/2 {
		t.Errorf("mem dir holds %d bytes; want about the base (%d) once plus the deltas (%d)", total, base, deltas)
	}

	// The first template goes with its child; the deltas' base stays, and
	// a new QEMU maps it: a fork of a delta template's child, which writes
	// first, is a delta on the same base.
	d.cliOK("rm", child(1))
	d.cliOK("gc")
	if _, err := os.Stat(filepath.Join(d.memDir, tpls[1]+".ram")); !os.IsNotExist(err) {
		t.Errorf("template %s's RAM name outlived its last child (%v)", tpls[1], err)
	}
	d.run(child(3), "sh", "-c", "echo from-d3 > /run/d3")
	e3 := d.n("e3")
	if fz, _ := d.lvForkTrace(child(3), e3); fz.RAMMode != "delta" {
		t.Errorf("fork of %s (a child of a delta template): RAM mode %s, want delta", child(3), fz.RAMMode)
	}
	check(e3, 3)
	if got := d.run(e3, "cat", "/run/d3"); got != "from-d3\n" {
		t.Errorf("%s: /run/d3 = %q", e3, got)
	}
	check(child(2), 2)
	d.advances(e3)
	d.advances(src)
	d.cliOK("rm", e3, child(2), child(3), child(4), child(5), src)
	if left := d.leftovers(); len(left) != 0 {
		t.Errorf("left after rm: %v", left)
	}
	d.assertEmpty()
}
