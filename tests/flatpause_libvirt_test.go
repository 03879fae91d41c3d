//go:build integration

package tests

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The flat-pause freeze on the libvirt driver (libvirtdrv/fork.go, the RAM
// plan shared with the embedded driver, sharedmem/plan.go): the source
// domain's RAM file becomes the template with no copy in the pause, the
// domain stays the same one, and children (remapped onto their template)
// fork again copying only their private pages (into a delta template).

// lvFork forks src into child through libvirt and returns the RAM mode and
// the bytes copied inside the pause, as the fork's --trace-json reports them.
func (d *driverEnv) lvFork(src, child string) (mode string, copied int64, res forkJSON) {
	d.t.Helper()
	r := d.cliOK("fork", src, child, "--json", "--trace-json")
	if err := jsonDecode(r.stdout, &res); err != nil || len(res.Children) != 1 {
		d.t.Fatalf("fork %s %s: %v: %s", src, child, err, r)
	}
	fz := frozenEvent(d.t, r.stderr)
	return fz.RAMMode, *fz.PausedCopyBytes, res
}

func (d *driverEnv) fill(name, file string, mib int) string {
	d.t.Helper()
	out := d.run(name, "sh", "-c", "dd if=/dev/urandom of="+file+" bs=1M count="+strconv.Itoa(mib)+" 2>/dev/null; md5sum "+file)
	return strings.Fields(out)[0]
}

func (d *driverEnv) sum(name, file string) string {
	d.t.Helper()
	return strings.Fields(d.run(name, "md5sum", file))[0]
}

// advances fails the test unless name's counter moves.
func (d *driverEnv) advances(name string) {
	d.t.Helper()
	c := d.count(name)
	if !eventually(30*time.Second, func() bool { return d.count(name) > c }) {
		d.t.Errorf("%s: counter stuck at %d: paused or broken", name, c)
	}
}

// domainOf is what identifies a libvirt domain and its QEMU: uuid, id, pid.
func domainOf(t *testing.T, name string) string {
	t.Helper()
	pid, _ := os.ReadFile("/run/libvirt/qemu/" + name + ".pid")
	return strings.TrimSpace(virshOK(t, "domuuid", name)) + " id " + strings.TrimSpace(virshOK(t, "domid", name)) + " pid " + strings.TrimSpace(string(pid))
}

// TestLibvirtFlatPause: a libvirt source holding non-zero data, with a
// counter process and an unsynced write, is forked; then its child, then the
// source again. The first freeze copies nothing in the pause; the later ones
// copy only pages written since (never the whole RAM, never a stream). The
// source stays the same domain and QEMU; counters keep their PID and run on
// everywhere; writes after a fork stay on their side; no template file
// changes after its children ran; removing the middle machine of the chain
// keeps its descendant working; nothing is left.
func TestLibvirtFlatPause(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	p, c1, g1, c2 := d.n("p"), d.n("c1"), d.n("g1"), d.n("c2")
	d.bootGuest(p)
	pid := strings.TrimSpace(d.run(p, "vmfork-counter", "start"))
	fill := d.fill(p, "/run/fill", 48)
	d.run(p, "sh", "-c", "echo unsynced > /data/unsynced")
	ident := domainOf(t, p)

	mode, copied, res := d.lvFork(p, c1)
	if mode != "first" || copied != 0 {
		t.Errorf("first fork of a booted source holding 48 MiB: RAM mode %s, %d bytes copied in the pause; want first, 0", mode, copied)
	}
	if got := domainOf(t, p); got != ident {
		t.Errorf("the source is another domain or process after the fork: %s, was %s", got, ident)
	}
	if st := strings.TrimSpace(virshOK(t, "domstate", p)); st != "running" {
		t.Errorf("source domain state %q after the fork, want running", st)
	}
	tpl1 := filepath.Join(d.memDir, res.Template+".ram")
	sum1 := fileSHA256(t, tpl1)
	for _, n := range []string{p, c1} {
		if got := strings.TrimSpace(d.run(n, "cat", "/run/counter.pid")); got != pid {
			t.Errorf("%s: counter pid %s, want %s", n, got, pid)
		}
		if d.sum(n, "/run/fill") != fill {
			t.Errorf("%s: /run/fill changed across the fork", n)
		}
		if got := d.run(n, "cat", "/data/unsynced"); got != "unsynced\n" {
			t.Errorf("%s: unsynced write = %q", n, got)
		}
		d.advances(n)
	}
	srcFill := d.fill(p, "/run/fill", 16)
	d.run(p, "sh", "-c", "echo from-src > /run/src-after")
	d.run(c1, "sh", "-c", "echo c1 > /run/gen")
	c1Fill := d.fill(c1, "/run/fill", 8)
	if r := d.cli("exec", c1, "--", "cat", "/run/src-after"); r.code == 0 {
		t.Errorf("%s sees a file the source wrote after the fork", c1)
	}
	if r := d.cli("exec", p, "--", "cat", "/run/gen"); r.code == 0 {
		t.Errorf("the source sees a file %s wrote after the fork", c1)
	}
	if fileSHA256(t, tpl1) != sum1 {
		t.Fatalf("template %s changed after its source and child wrote memory", res.Template)
	}

	// A fork of the child: it maps its template privately (remapped at its
	// start), so only the pages it wrote are copied, into a delta on that
	// template (delta.go; TestLibvirtDeltaForks).
	mode, copied, _ = d.lvFork(c1, g1)
	if mode != "delta" || copied > 40<<20 {
		t.Errorf("fork of child %s: RAM mode %s, %d bytes copied in the pause; want delta, about the 8 MiB it wrote (never its 256 MiB)", c1, mode, copied)
	}
	if d.sum(g1, "/run/fill") != c1Fill || d.run(g1, "cat", "/run/gen") != "c1\n" {
		t.Errorf("%s does not hold its parent %s's memory at the fork", g1, c1)
	}
	if got := strings.TrimSpace(d.run(g1, "cat", "/run/counter.pid")); got != pid {
		t.Errorf("%s: counter pid %s, want %s", g1, got, pid)
	}

	// The source again: its first template is still mapped by c1, so its
	// private pages go into a delta on that file.
	mode, copied, _ = d.lvFork(p, c2)
	if mode != "delta" || copied > 48<<20 {
		t.Errorf("second fork of the source: RAM mode %s, %d bytes copied in the pause; want delta, about the 16 MiB written since", mode, copied)
	}
	if got := domainOf(t, p); got != ident {
		t.Errorf("the source is another domain or process after its second fork: %s, was %s", got, ident)
	}
	if d.sum(c2, "/run/fill") != srcFill || d.run(c2, "cat", "/run/src-after") != "from-src\n" {
		t.Errorf("%s does not hold the source's memory at the second fork", c2)
	}
	if d.sum(c1, "/run/fill") != c1Fill {
		t.Errorf("%s's memory changed when its source forked again", c1)
	}
	if fileSHA256(t, tpl1) != sum1 {
		t.Fatalf("template %s changed after later forks and writes", res.Template)
	}

	d.cliOK("rm", c1)
	d.advances(g1)
	if d.run(g1, "cat", "/run/gen") != "c1\n" {
		t.Errorf("%s lost its state when its parent %s went", g1, c1)
	}
	d.run(g1, "sh", "-c", "echo still > /data/after-rm; sync")
	d.advances(p)
	d.cliOK("rm", g1, c2, p)
	if left := d.leftovers(); len(left) != 0 {
		t.Errorf("left after rm: %v", left)
	}
	d.assertEmpty()
}

// TestLibvirtFlatPauseFailure injects a failure inside a libvirt freeze,
// before and after the source's RAM was remapped: the fork fails, the source
// domain runs on with its state intact, nothing of the fork is left, and the
// next fork works.
func TestLibvirtFlatPauseFailure(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	s := d.n("s")
	d.bootGuest(s)
	pid := strings.TrimSpace(d.run(s, "vmfork-counter", "start"))
	fill := d.fill(s, "/run/fill", 16)
	ident := domainOf(t, s)
	for _, point := range []string{"after-stop", "before-ram", "after-ram"} {
		t.Run(point, func(t *testing.T) {
			f := d.withFailpoints()
			f.env = f.env.withEnv(freezeFailEnv + "=" + point)
			r := f.cli("fork", s, d.n("x"))
			if r.code == 0 || !strings.Contains(r.stderr, "injected failure") {
				t.Fatalf("fork with a failure at %s: %s, want it to fail naming the failure", point, r)
			}
			if st := strings.TrimSpace(virshOK(t, "domstate", s)); st != "running" {
				t.Errorf("source domain %q after a failed fork, want running", st)
			}
			if got := domainOf(t, s); got != ident {
				t.Errorf("source is %s after a failed fork, was %s", got, ident)
			}
			d.advances(s)
			if got := strings.TrimSpace(d.run(s, "cat", "/run/counter.pid")); got != pid {
				t.Errorf("counter pid %s after a failed fork, want %s", got, pid)
			}
			if d.sum(s, "/run/fill") != fill {
				t.Errorf("the source's memory changed in a failed fork")
			}
			if ms := d.machines(); len(ms) != 1 {
				t.Errorf("machines after a failed fork: %v, want %s only", ms, s)
			}
			if left := domains(t, d.n("x")); len(left) != 0 {
				t.Errorf("a failed fork left domains %v", left)
			}
			if left, _ := filepath.Glob(filepath.Join(d.memDir, "*")); len(left) != 0 {
				t.Errorf("a failed fork left RAM files: %v", left)
			}
			if left, _ := filepath.Glob(filepath.Join(d.memDir, ".*")); len(left) != 0 {
				t.Errorf("a failed fork left temporary RAM files: %v", left)
			}
		})
	}
	ok1 := d.n("ok1")
	d.cliOK("fork", s, ok1)
	if d.sum(ok1, "/run/fill") != fill {
		t.Errorf("fork after the failures: child's memory differs")
	}
	d.advances(ok1)
	d.cliOK("rm", ok1, s)
	if left := d.leftovers(); len(left) != 0 {
		t.Errorf("left after rm: %v", left)
	}
	d.assertEmpty()
}
