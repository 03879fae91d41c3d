//go:build integration

package tests

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
)

// TestLibvirtDeltaLifecycle (issue 27) is the rest of TestDeltaForks on the
// libvirt driver: what a child of a delta template goes through. A source
// domain forked twice, writing between the forks (a counter and a file per
// instant), so that the second template is a delta on the first; its child
// is checkpointed, changed and rewound, then hibernated and resumed (each a
// new domain under its name: libvirtdrv StartInPlace), and keeps its
// instant; the resumed domain, forked, makes a delta template, which is
// exported (compacted), imported under another name and forked (the domain
// XML travels in the archive). Nothing is left.
func TestLibvirtDeltaLifecycle(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	d := newDriverEnv(t, []string{"--connect", libvirtURI})
	src, d1, d2, e2 := d.n("src"), d.n("d1"), d.n("d2"), d.n("e2")
	inst, g2 := d.n("inst2"), d.n("g2")
	start := time.Now()
	lap := func(what string) { t.Logf("%.1f s: %s", time.Since(start).Seconds(), what) }
	d.bootGuest(src)
	pid := strings.TrimSpace(d.run(src, "vmfork-counter", "start"))
	sums := map[int]string{}
	var tpl2 string
	for i, child := range []string{d1, d2} {
		n := strconv.Itoa(i + 1)
		d.run(src, "sh", "-c", "echo "+n+" > /run/instant")
		sums[i+1] = d.fill(src, "/run/file-"+n, 1)
		fz, res := d.lvForkTrace(src, child)
		rec := d.templateRecord(res.Template)
		if i == 1 && (fz.RAMMode != "delta" || rec.RAMDelta == nil) {
			t.Fatalf("second fork: RAM mode %s, delta %+v; want a delta", fz.RAMMode, rec.RAMDelta)
		}
		tpl2 = res.Template
	}
	var ls []vmfork.TemplateStatus
	d.cliJSON(&ls, "template", "ls")
	for _, st := range ls {
		if st.ID == tpl2 && (st.DeltaStats == nil || st.Kind != "delta" || st.Depth < 1) {
			t.Errorf("template ls: %s is %+v, want a delta", st.ID, st.DeltaStats)
		}
	}

	// check fails the test unless machine name holds instant i: its
	// /run/instant, the counter's pid and the instants' files (one exec).
	check := func(name string, i int) {
		t.Helper()
		got := strings.Fields(d.run(name, "sh", "-c", "cat /run/instant /run/counter.pid; for k in 1 2; do "+
			"if [ -e /run/file-$k ]; then md5sum /run/file-$k | cut -d' ' -f1; else echo -; fi; done"))
		want := []string{strconv.Itoa(i), pid, sums[1], "-"}
		if i == 2 {
			want[3] = sums[2]
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: instant, counter pid and file sums %q, want instant %d's %q", name, got, i, want)
		}
	}
	check(d2, 2)
	lap("booted and forked twice")

	// (1) A checkpoint of the delta child, a change, a rewind to it.
	cp := d.n("cp")
	d.cliOK("checkpoint", d2, "--as", cp)
	d.run(d2, "sh", "-c", "echo changed > /run/instant; rm /run/file-1")
	d.cliOK("rewind", d2, "--to", cp)
	check(d2, 2)
	lap("checkpoint and rewind")

	// (2) Hibernate and resume: the counter goes on from where it was.
	before := d.count(d2)
	d.cliOK("hibernate", d2)
	if st := d.machines()[d2].State; st != "hibernated" {
		t.Errorf("%s after hibernate: %s, want hibernated", d2, st)
	}
	if r := d.cli("hibernate", d2); r.code == 0 || !strings.Contains(r.stderr, "hibernated already") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("hibernate of hibernated %s: %s, want one line saying it is hibernated already", d2, r)
	}
	if r := d.vmfork("resume", d2); r.code == 0 || !strings.Contains(r.stderr, `belongs to driver "libvirt"`) {
		t.Errorf("resume of %s without --connect: %s, want it refused naming the libvirt driver", d2, r)
	}
	d.cliOK("resume", d2)
	if after := d.count(d2); after < before {
		t.Errorf("%s: counter %d after resume, was %d before hibernate: not the instant it left", d2, after, before)
	}
	check(d2, 2)
	d.advances(d2)
	lap("hibernate and resume")

	// (3) A delta template exported while its child maps it (a live
	// fork's template no child maps keeps only its disk): the resumed
	// domain, forked, makes one. The export compacts it into one full
	// file (an archive holds one); it is imported under another name
	// and forked.
	fz, res := d.lvForkTrace(d2, e2)
	if rec := d.templateRecord(res.Template); fz.RAMMode != "delta" || rec.RAMDelta == nil {
		t.Errorf("fork of resumed %s: RAM mode %s, delta %+v; want a delta", d2, fz.RAMMode, rec.RAMDelta)
	}
	archive := filepath.Join(t.TempDir(), "e2.vmt")
	d.cliOK("template", "export", res.Template, archive)
	if rec := d.templateRecord(res.Template); rec.RAMDelta != nil {
		t.Errorf("template %s is still a delta after its export: %+v", res.Template, rec.RAMDelta)
	}
	d.cliOK("template", "import", archive, "--as", inst)
	d.cliOK("fork", inst, g2)
	check(g2, 2)
	check(e2, 2)
	d.advances(g2)
	lap("export, import and fork")

	d.cliOK("rm", g2, e2, d1, d2, src)
	d.cliOK("template", "rm", inst)
	d.cli("template", "rm", cp) // unless rm took its machine's checkpoints
	d.cliOK("gc")
	if left := d.leftovers(); len(left) != 0 {
		t.Errorf("left after rm: %v", left)
	}
	d.assertEmpty()
}
