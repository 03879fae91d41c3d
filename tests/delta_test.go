//go:build integration

package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vmfork/vmfork"
)

// templateRecord reads template id's record.
func (e *env) templateRecord(id string) vmfork.Template {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.stateDir, "templates", id, "manifest.json"))
	if err != nil {
		e.t.Fatalf("template %s: %v", id, err)
	}
	var tpl vmfork.Template
	if err := json.Unmarshal(b, &tpl); err != nil {
		e.t.Fatalf("template %s record: %v", id, err)
	}
	return tpl
}

// memDirBytes is what the files in the mem dir hold (allocated blocks),
// each file counted once however many names it has, and the bytes of each
// name's file.
func (e *env) memDirBytes() (total int64, byName map[string]int64) {
	e.t.Helper()
	ents, err := os.ReadDir(e.memDir)
	if err != nil {
		e.t.Fatal(err)
	}
	seen := map[uint64]bool{}
	byName = map[string]int64{}
	for _, d := range ents {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(e.memDir, d.Name()), &st); err != nil {
			continue
		}
		byName[d.Name()] = st.Blocks * 512
		if !seen[st.Ino] {
			seen[st.Ino] = true
			total += st.Blocks * 512
		}
	}
	return total, byName
}

// deltaApplied is what a child's "delta applied" debug log line says
// (sharedmem.ApplyStats.LogFields): the chain's bytes, how many of them
// were mapped from the delta files (in how many runs) and copied.
type deltaApplied struct {
	bytes, mapped, copied int64
	mappedRuns            int64
}

var deltaAppliedField = regexp.MustCompile(`\b(delta_bytes|delta_mapped_bytes|delta_copied_bytes|delta_mapped_runs)=([0-9]+)`)

// deltaAppliedOf finds the "delta applied" line in a fork's stderr (run
// with --log-level debug); false when there is none.
func deltaAppliedOf(stderr string) (deltaApplied, bool) {
	for _, l := range strings.Split(stderr, "\n") {
		if !strings.Contains(l, `msg="delta applied"`) {
			continue
		}
		var d deltaApplied
		for _, m := range deltaAppliedField.FindAllStringSubmatch(l, -1) {
			n, _ := strconv.ParseInt(m[2], 10, 64)
			switch m[1] {
			case "delta_bytes":
				d.bytes = n
			case "delta_mapped_bytes":
				d.mapped = n
			case "delta_copied_bytes":
				d.copied = n
			case "delta_mapped_runs":
				d.mappedRuns = n
			}
		}
		return d, true
	}
	return deltaApplied{}, false
}

// forkDebug is forkMode with the debug log, and what its child's "delta
// applied" line says (false: none, the template is a full file).
func (e *env) forkDebug(src, child string) (traceEvent, forkJSON, deltaApplied, bool) {
	e.t.Helper()
	r := e.ok("--log-level", "debug", "fork", src, child, "--json", "--trace-json")
	var res forkJSON
	if err := jsonDecode(r.stdout, &res); err != nil || len(res.Children) != 1 {
		e.t.Fatalf("fork %s %s: %v: %s", src, child, err, r)
	}
	da, ok := deltaAppliedOf(r.stderr)
	return frozenEvent(e.t, r.stderr), res, da, ok
}

// checkApplied fails the test unless a child of a delta template got its
// chain (bytes, each page once), mapped or copied, and returns the bytes
// mapped.
func checkApplied(t *testing.T, child string, da deltaApplied, ok bool) int64 {
	t.Helper()
	if !ok || da.bytes == 0 || da.mapped+da.copied != da.bytes || (da.mapped > 0) != (da.mappedRuns > 0) {
		t.Errorf("%s: delta applied %+v (logged: %v); want the chain's bytes, mapped plus copied", child, da, ok)
	}
	t.Logf("%s: chain of %d KiB: %d KiB mapped in %d runs, %d KiB copied", child, da.bytes>>10, da.mapped>>10, da.mappedRuns, da.copied>>10)
	return da.mapped
}

// TestDeltaForks (issue 27): a source forked 5 times, every child kept,
// writing between the forks (a counter and a file per instant). The first
// fork's template is the source's own file; every later one is a delta on
// it, with no copy of the frozen file. Every child holds exactly its
// instant's memory, the mem dir holds the used RAM once plus the deltas, a
// fork of a delta template's child works, and the base outlives its own
// template while deltas need it.
func TestDeltaForks(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("src")
	pid := strings.TrimSpace(e.exec("src", "vmfork-counter", "start"))
	e.fillRun("src", "/run/fill", 24)
	const forks = 5
	sums := map[int]string{} // the file each instant wrote
	tpls := map[int]string{}
	tplBytes := map[int]int64{}
	var deltas, mapped int64
	for i := 1; i <= forks; i++ {
		n := strconv.Itoa(i)
		e.exec("src", "sh", "-c", "echo "+n+" > /run/instant")
		sums[i] = e.fillRun("src", "/run/file-"+n, 1)
		fz, res, da, applied := e.forkDebug("src", "d"+n)
		tpls[i] = res.Template
		if i > 1 {
			mapped += checkApplied(t, "d"+n, da, applied)
		} else if applied {
			t.Errorf("fork 1 (a full file): its child applied a delta: %+v", da)
		}
		rec := e.templateRecord(res.Template)
		switch {
		case i == 1 && (fz.RAMMode != "first" || rec.RAMDelta != nil):
			t.Errorf("fork 1: RAM mode %s, delta %v; want first, a full file", fz.RAMMode, rec.RAMDelta)
		case i > 1 && (fz.RAMMode != "delta" || rec.RAMDelta == nil):
			t.Fatalf("fork %d: RAM mode %s, delta %+v; want a delta", i, fz.RAMMode, rec.RAMDelta)
		case i > 1 && *fz.PrecopiedBytes > 2*rec.RAMDelta.Bytes:
			// Before the pause (sharedmem/delta.go, precopy): at
			// fork 2, with no last delta, the private pages; later,
			// the pages written since the last delta's instant,
			// into the chained delta. Never the frozen file.
			t.Errorf("fork %d: %d bytes copied before the pause for a delta of %d; want at most the delta's pages", i, *fz.PrecopiedBytes, rec.RAMDelta.Bytes)
		case i > 1 && (*fz.PrecopiedBytes == 0 || *fz.PausedCopyBytes >= rec.RAMDelta.Bytes):
			// The pause writes only what the guest wrote after that
			// copy (the counter's few pages), not the instant's.
			t.Errorf("fork %d: %d bytes written in the pause for a delta of %d, %d before it: the delta was not brought up to date before the pause", i, *fz.PausedCopyBytes, rec.RAMDelta.Bytes, *fz.PrecopiedBytes)
		case i > 1:
			deltas += rec.RAMDelta.Bytes
			// From the third fork the source's writes are tracked
			// since the last delta (sharedmem/track.go): each delta
			// holds only what changed since the one before, which it
			// names (sharedmem/chain.go), a chain one longer a fork.
			if rec.RAMDelta.Depth() != i-1 {
				t.Errorf("fork %d: a chain of %d deltas (%v), want %d", i, rec.RAMDelta.Depth(), rec.RAMDelta.Chain, i-1)
			}
			if i > 2 && rec.RAMDelta.Bytes > 2*tplBytes[i-1] {
				t.Errorf("fork %d: delta of %d bytes after one of %d: it holds more than what changed since", i, rec.RAMDelta.Bytes, tplBytes[i-1])
			}
			tplBytes[i] = rec.RAMDelta.Bytes
			t.Logf("fork %d: delta %d KiB, %d KiB written in the pause, %d KiB before", i, rec.RAMDelta.Bytes>>10, *fz.PausedCopyBytes>>10, *fz.PrecopiedBytes>>10)
			if _, err := os.Stat(filepath.Join(e.memDir, res.Template+".ram")); !os.IsNotExist(err) {
				t.Errorf("delta template %s has a full RAM file (%v)", res.Template, err)
			}
		}
	}
	check := func(child string, i int) {
		t.Helper()
		if got := e.exec(child, "cat", "/run/instant"); got != strconv.Itoa(i)+"\n" {
			t.Errorf("%s: /run/instant = %q, want %d", child, got, i)
		}
		for k := 1; k <= forks; k++ {
			f := "/run/file-" + strconv.Itoa(k)
			if k > i {
				if r := e.vmfork("exec", child, "--", "cat", f); r.code == 0 {
					t.Errorf("%s (instant %d) has %s, written after its instant", child, i, f)
				}
				continue
			}
			if got := e.md5(child, f); got != sums[k] {
				t.Errorf("%s: %s differs from what instant %d wrote", child, f, k)
			}
		}
		if got := strings.TrimSpace(e.exec(child, "cat", "/run/counter.pid")); got != pid {
			t.Errorf("%s: counter pid %s, want %s", child, got, pid)
		}
	}
	for i := 1; i <= forks; i++ {
		check("d"+strconv.Itoa(i), i)
	}
	// The children map the deltas' long runs (sharedmem/overlay.go): a
	// build that copies every page fails here.
	if mapped == 0 {
		t.Error("no child of a delta template mapped any of its deltas' pages: all copied")
	}
	// The mem dir: the source's file (the first template, every delta's
	// base) once, and the deltas. Full copies would be forks × that file.
	total, byName := e.memDirBytes()
	base := byName[tpls[1]+".ram"]
	t.Logf("mem dir %d MiB: base %d MiB, deltas %d KiB in all (%d forks)", total>>20, base>>20, deltas>>10, forks)
	if total > base+deltas+(4<<20) || deltas > base/2 {
		t.Errorf("mem dir holds %d bytes; want about the base (%d) once plus the deltas (%d)", total, base, deltas)
	}

	// A child of a delta template writes, and is forked: a delta again.
	e.exec("d3", "sh", "-c", "echo from-d3 > /run/d3")
	// d3 maps its chain's runs: its fork reads them as its own pages.
	fz, _, da, applied := e.forkDebug("d3", "e3")
	if fz.RAMMode != "delta" {
		t.Errorf("fork of d3 (a child of a delta template): RAM mode %s, want delta", fz.RAMMode)
	}
	checkApplied(t, "e3", da, applied)
	check("e3", 3)
	if got := e.exec("e3", "cat", "/run/d3"); got != "from-d3\n" {
		t.Errorf("e3: /run/d3 = %q", got)
	}

	// template ls names each template's kind and chain; compact makes
	// a chain one full file, and the child that applied it runs on.
	var ls []vmfork.TemplateStatus
	e.jsonOK(&ls, "template", "ls", "--json")
	for _, st := range ls {
		if st.ID == tpls[4] && (st.DeltaStats == nil || st.Kind != "delta" || st.Depth != 3) {
			t.Errorf("template ls: %s is %+v, want a delta of depth 3", st.ID, st.DeltaStats)
		}
	}
	var cres vmfork.CompactResult
	e.jsonOK(&cres, "template", "compact", tpls[4], "--json")
	if !cres.Compacted || cres.Depth != 3 {
		t.Errorf("template compact %s: %+v, want a chain of 3 compacted", tpls[4], cres)
	}
	if rec := e.templateRecord(tpls[4]); rec.RAMDelta != nil {
		t.Errorf("template %s is still a delta after compact", tpls[4])
	}
	check("d4", 4)

	// A delta child hibernates and resumes, and is rewound to a
	// checkpoint (both freeze it into full files: no delta).
	e.exec("d2", "sh", "-c", "echo 2b > /run/instant")
	e.ok("hibernate", "d2")
	e.ok("resume", "d2")
	if got := e.exec("d2", "cat", "/run/instant"); got != "2b\n" {
		t.Errorf("d2 after hibernate and resume: /run/instant = %q, want 2b", got)
	}
	e.exec("d2", "sh", "-c", "echo 2 > /run/instant")
	check("d2", 2)
	e.ok("checkpoint", "d5", "--as", "d5-cp")
	e.exec("d5", "sh", "-c", "echo changed > /run/instant; rm /run/file-1")
	e.ok("rewind", "d5", "--to", "d5-cp")
	check("d5", 5)

	// An export of a delta template compacts it into a full file first:
	// the archive holds the instant (a fork of its import sees it).
	archive := filepath.Join(t.TempDir(), "d3.vmt")
	e.ok("template", "export", tpls[3], archive)
	if rec := e.templateRecord(tpls[3]); rec.RAMDelta != nil {
		t.Errorf("template %s is still a delta after its export: %+v", tpls[3], rec.RAMDelta)
	}
	e.ok("template", "import", archive, "--as", "inst3")
	e.ok("fork", "inst3", "g3")
	check("g3", 3)
	check("d3", 3)
	e.ok("rm", "g3")
	e.ok("template", "rm", "inst3")

	// The first template goes with its child; the deltas' base stays.
	e.ok("rm", "d1")
	e.ok("gc")
	if _, err := os.Stat(filepath.Join(e.memDir, tpls[1]+".ram")); !os.IsNotExist(err) {
		t.Errorf("template %s's RAM name outlived its last child (%v)", tpls[1], err)
	}
	// A new QEMU on the base after its own template went: a fork of d5.
	e.forkMode("d5", "f5")
	check("f5", 5)
	check("d2", 2)
	e.counterAdvances("f5")
	e.counterAdvances("src")
	e.ok("rm", "e3", "f5", "d2", "d3", "d4", "d5", "src")
	e.vmfork("template", "rm", "d5-cp") // unless rm took its machine's checkpoints
	e.assertEmpty()
}
