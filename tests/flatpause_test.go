//go:build integration

package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
)

// The flat-pause freeze (qemudrv/freeze.go): no RAM copy in the pause, the
// source remapped in place onto its frozen RAM, forks of forks that never
// stream a machine's RAM. These tests check what must hold whatever the
// timing; the pause itself is measured by `vmfork bench scale`.

// fillRun writes size MiB of random (non-zero) data into the guest's tmpfs,
// so that the source holds used RAM, and returns its checksum.
func (e *env) fillRun(name, file string, mib int) string {
	e.t.Helper()
	out := e.exec(name, "sh", "-c", "dd if=/dev/urandom of="+file+" bs=1M count="+strconv.Itoa(mib)+" 2>/dev/null; md5sum "+file)
	return strings.Fields(out)[0]
}

// devStateFormat returns the device-state format template id's manifest
// records ("" for a migration stream).
func (e *env) devStateFormat(id string) string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.stateDir, "templates", id, "manifest.json"))
	if err != nil {
		e.t.Fatalf("template %s: %v", id, err)
	}
	var tpl vmfork.Template
	if err := json.Unmarshal(b, &tpl); err != nil {
		e.t.Fatalf("template %s manifest: %v", id, err)
	}
	return tpl.Manifest.DevStateFormat
}

func (e *env) md5(name, file string) string {
	e.t.Helper()
	out := e.exec(name, "md5sum", file)
	return strings.Fields(out)[0]
}

// forkMode forks src into child and returns the freeze as the fork's
// --trace-json reports it (RAM mode first, diff or stream, and the bytes
// copied before and in the pause) and the fork's result.
func (e *env) forkMode(src, child string) (traceEvent, forkJSON) {
	e.t.Helper()
	r := e.ok("fork", src, child, "--json", "--trace-json")
	var res forkJSON
	if err := jsonDecode(r.stdout, &res); err != nil || len(res.Children) != 1 {
		e.t.Fatalf("fork %s %s: %v: %s", src, child, err, r)
	}
	return frozenEvent(e.t, r.stderr), res
}

// counterAdvances fails the test unless name's counter moves.
func (e *env) counterAdvances(name string) {
	e.t.Helper()
	c := e.counter(name)
	deadline := time.Now().Add(30 * time.Second)
	for e.counter(name) <= c {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: counter stuck at %d: paused or broken", name, c)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// TestFlatPauseContinues: a source holding non-zero data, with a counter
// process and an unsynced write, forks three times (its own file becomes
// the first template; then private pages onto a copy; then, its earlier
// templates gone, in place). Source and children continue with the same
// PIDs and data, their later writes stay their own, and no template file
// changes after its children and its source ran and wrote.
func TestFlatPauseContinues(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("src")
	pid := strings.TrimSpace(e.exec("src", "vmfork-counter", "start"))
	fill := e.fillRun("src", "/run/fill", 48)
	e.exec("src", "sh", "-c", "echo unsynced > /data/unsynced")

	fz, res := e.forkMode("src", "c1")
	if fz.RAMMode != "first" || *fz.PausedCopyBytes != 0 {
		t.Errorf("first fork of a booted source: RAM mode %s, %d bytes copied in the pause; want first (no copy)", fz.RAMMode, *fz.PausedCopyBytes)
	}
	tpl1 := filepath.Join(e.memDir, res.Template+".ram")
	sum1 := fileSHA256(t, tpl1)
	// Its whole memory is in the template's RAM file, so the device state
	// is the device sections alone, saved with no migration.
	if f := e.devStateFormat(res.Template); f != vmfork.DevStateDevices {
		t.Errorf("template %s: device state format %q, want %q", res.Template, f, vmfork.DevStateDevices)
	}
	for _, n := range []string{"src", "c1"} {
		if got := strings.TrimSpace(e.exec(n, "cat", "/run/counter.pid")); got != pid {
			t.Errorf("%s: counter pid %s, want %s", n, got, pid)
		}
		if got := e.md5(n, "/run/fill"); got != fill {
			t.Errorf("%s: /run/fill changed across the fork", n)
		}
		if got := e.exec(n, "cat", "/data/unsynced"); got != "unsynced\n" {
			t.Errorf("%s: unsynced write = %q", n, got)
		}
		e.counterAdvances(n)
	}
	// Both write a lot after the fork: the source's writes once went to
	// the very file that is now the template. (The source's 16 MiB stay
	// below a quarter of its used RAM, so its next fork is a delta, not a
	// copy: sharedmem/delta.go, maxDeltaShare.)
	srcFill := e.fillRun("src", "/run/fill", 16)
	e.exec("src", "sh", "-c", "echo from-src > /run/src-after")
	e.fillRun("c1", "/run/other", 32)
	e.exec("c1", "sh", "-c", "echo from-c1 > /run/c1-after")
	if r := e.vmfork("exec", "c1", "--", "cat", "/run/src-after"); r.code == 0 {
		t.Errorf("c1 sees a file the source wrote after the fork")
	}
	if r := e.vmfork("exec", "src", "--", "cat", "/run/c1-after"); r.code == 0 {
		t.Errorf("the source sees a file c1 wrote after the fork")
	}
	if got := fileSHA256(t, tpl1); got != sum1 {
		t.Fatalf("template %s changed after its source and child wrote memory", res.Template)
	}

	// Second fork: c1 still maps the first template, so the source's
	// private pages make a delta on it (issue 27): the first template's
	// file the base, never copied; before the pause only the private
	// pages (the first delta's pre-copy, sharedmem/delta.go).
	fz, res2 := e.forkMode("src", "c2")
	rec2 := e.templateRecord(res2.Template)
	if fz.RAMMode != "delta" || rec2.RAMDelta == nil || *fz.PrecopiedBytes > 2*rec2.RAMDelta.Bytes {
		t.Errorf("second fork: RAM mode %s, delta %+v, %d bytes copied before the pause; want delta, at most its private pages", fz.RAMMode, rec2.RAMDelta, *fz.PrecopiedBytes)
	}
	tpl2 := filepath.Join(e.memDir, res2.Template+".delta")
	sum2 := fileSHA256(t, tpl2)
	if got := e.md5("c2", "/run/fill"); got != srcFill {
		t.Errorf("c2 does not hold the source's memory at the second fork")
	}
	if got := e.exec("c2", "cat", "/run/src-after"); got != "from-src\n" {
		t.Errorf("c2: /run/src-after = %q", got)
	}
	if got := strings.TrimSpace(e.exec("c2", "cat", "/run/counter.pid")); got != pid {
		t.Errorf("c2: counter pid %s, want %s", got, pid)
	}
	e.fillRun("src", "/run/fill", 16)
	e.fillRun("c2", "/run/fill", 16)
	if got := e.md5("c1", "/run/fill"); got != fill {
		t.Errorf("c1's memory changed when its source forked again")
	}
	if fileSHA256(t, tpl1) != sum1 || fileSHA256(t, tpl2) != sum2 {
		t.Fatalf("a template changed after a later fork and writes")
	}

	// With both children gone no one needs the source's RAM file but the
	// source: the third fork writes its private pages into it in place.
	e.ok("rm", "c1", "c2")
	srcFill = e.md5("src", "/run/fill")
	fz, _ = e.forkMode("src", "c3")
	if fz.RAMMode != "diff" || *fz.PrecopiedBytes != 0 {
		t.Errorf("third fork: RAM mode %s, %d bytes copied before the pause; want diff in place (nothing copied)", fz.RAMMode, *fz.PrecopiedBytes)
	}
	if got := e.md5("c3", "/run/fill"); got != srcFill {
		t.Errorf("c3 does not hold the source's memory at the third fork")
	}
	e.counterAdvances("c3")
	e.counterAdvances("src")
	e.ok("rm", "c3", "src")
	e.assertEmpty()
}

// assertEmpty fails the test if anything of the env is left.
func (e *env) assertEmpty() {
	e.t.Helper()
	if left, _ := filepath.Glob(filepath.Join(e.stateDir, "templates", "*")); len(left) != 0 {
		e.t.Errorf("templates left: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(e.memDir, "*")); len(left) != 0 {
		e.t.Errorf("RAM files left: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(e.memDir, ".*")); len(left) != 0 {
		e.t.Errorf("temporary RAM files left: %v", left)
	}
	if ps := e.qemuProcesses(); len(ps) != 0 {
		e.t.Errorf("QEMU processes left: %v", ps)
	}
}

// TestFlatPauseChain forks a child and a grandchild: each continues its
// parent's state, none streams its RAM, and removing a middle machine keeps
// its descendants working.
func TestFlatPauseChain(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("g0")
	pid := strings.TrimSpace(e.exec("g0", "vmfork-counter", "start"))
	e.fillRun("g0", "/run/fill", 32)
	names := []string{"g0", "g1", "g2", "g3"}
	for i := 1; i < len(names); i++ {
		parent, child := names[i-1], names[i]
		e.exec(parent, "sh", "-c", "echo "+parent+" > /run/gen-"+strconv.Itoa(i)+"; echo "+parent+" > /data/gen")
		want := e.md5(parent, "/run/fill")
		fz, _ := e.forkMode(parent, child)
		if i > 1 && fz.RAMMode != "diff" && fz.RAMMode != "delta" {
			t.Errorf("fork of %s (a child): RAM mode %s, want diff or delta (never stream)", parent, fz.RAMMode)
		}
		if got := e.md5(child, "/run/fill"); got != want {
			t.Errorf("%s: memory differs from its parent's at the fork", child)
		}
		for k := 1; k <= i; k++ {
			if got := e.exec(child, "cat", "/run/gen-"+strconv.Itoa(k)); got != names[k-1]+"\n" {
				t.Errorf("%s: /run/gen-%d = %q, want %s", child, k, got, names[k-1])
			}
		}
		if got := e.exec(child, "cat", "/data/gen"); got != parent+"\n" {
			t.Errorf("%s: /data/gen = %q, want %s", child, got, parent)
		}
		if got := strings.TrimSpace(e.exec(child, "cat", "/run/counter.pid")); got != pid {
			t.Errorf("%s: counter pid %s, want %s", child, got, pid)
		}
		// The child changes its memory before it is forked in turn.
		e.fillRun(child, "/run/fill", 8)
	}
	e.ok("rm", "g1")
	for _, n := range []string{"g2", "g3"} {
		e.counterAdvances(n)
		if got := e.exec(n, "cat", "/run/gen-2"); got != "g1\n" {
			t.Errorf("%s after its ancestor g1 went: /run/gen-2 = %q", n, got)
		}
		e.exec(n, "sh", "-c", "echo still > /data/after-rm; sync")
	}
	e.ok("rm", "g3", "g2", "g0")
	e.assertEmpty()
}

// TestFlatPauseLoop is an agent's loop: a checkpoint fork of the same source
// before each of 20 steps, the previous checkpoint removed. Each child holds
// the source's state at its fork, and nothing is left once all is removed.
func TestFlatPauseLoop(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("agent")
	e.exec("agent", "vmfork-counter", "start")
	e.fillRun("agent", "/run/fill", 16)
	for i := 1; i <= 20; i++ {
		step := strconv.Itoa(i)
		e.exec("agent", "sh", "-c", "echo "+step+" > /run/step; dd if=/dev/urandom of=/run/work bs=1M count=2 2>/dev/null")
		cp := "cp" + step
		e.ok("fork", "agent", cp)
		if i%5 == 0 || i == 1 {
			if got := e.exec(cp, "cat", "/run/step"); got != step+"\n" {
				t.Errorf("%s: /run/step = %q, want %s", cp, got, step)
			}
			if e.md5(cp, "/run/work") != e.md5("agent", "/run/work") {
				t.Errorf("%s: /run/work differs from the source's at its fork", cp)
			}
		}
		if i > 1 {
			e.ok("rm", "cp"+strconv.Itoa(i-1))
		}
		// Only the live checkpoint's template keeps RAM. (Its frozen disk
		// builds on the earlier ones', which stay as disk layers.)
		if ts, _ := filepath.Glob(filepath.Join(e.memDir, "agent.*.ram")); len(ts) != 1 {
			t.Errorf("step %d: template RAM files %v, want the live checkpoint's only", i, ts)
		}
		if tmp, _ := filepath.Glob(filepath.Join(e.memDir, ".*")); len(tmp) != 0 {
			t.Errorf("step %d: temporary RAM files left: %v", i, tmp)
		}
	}
	e.counterAdvances("agent")
	e.ok("rm", "cp20", "agent")
	e.assertEmpty()
}

// TestFlatPauseFailure injects a failure inside the freeze, before and after
// the source's RAM was remapped: the fork fails, the source runs on with its
// state intact, nothing of the fork is left, and the next fork works.
func TestFlatPauseFailure(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("s")
	pid := strings.TrimSpace(e.exec("s", "vmfork-counter", "start"))
	fill := e.fillRun("s", "/run/fill", 16)
	for _, point := range []string{"after-stop", "before-ram", "after-ram"} {
		t.Run(point, func(t *testing.T) {
			r := e.withFailpoints().withEnv(freezeFailEnv+"="+point).vmfork("fork", "s", "x")
			if r.code == 0 || !strings.Contains(r.stderr, "injected failure") {
				t.Fatalf("fork with a failure at %s: %s, want it to fail naming the failure", point, r)
			}
			e.counterAdvances("s")
			if got := strings.TrimSpace(e.exec("s", "cat", "/run/counter.pid")); got != pid {
				t.Errorf("counter pid %s after a failed fork, want %s", got, pid)
			}
			if got := e.md5("s", "/run/fill"); got != fill {
				t.Errorf("the source's memory changed in a failed fork")
			}
			if ms := e.list(); len(ms) != 1 {
				t.Errorf("machines after a failed fork: %+v, want s only", ms)
			}
			// The template's frozen disk may stay until the source's chain
			// no longer reads it (gc.go); its RAM never does.
			if left, _ := filepath.Glob(filepath.Join(e.memDir, "s.*.ram")); len(left) != 0 {
				t.Errorf("a failed fork left template RAM files: %v", left)
			}
			if left, _ := filepath.Glob(filepath.Join(e.memDir, ".*")); len(left) != 0 {
				t.Errorf("a failed fork left temporary RAM files: %v", left)
			}
		})
	}
	e.ok("fork", "s", "ok1")
	if got := e.md5("ok1", "/run/fill"); got != fill {
		t.Errorf("fork after the failures: child's memory differs")
	}
	e.ok("fork", "s", "ok2")
	e.counterAdvances("ok2")
	e.ok("rm", "ok1", "ok2", "s")
	if _, err := os.Stat(e.memDir); err != nil {
		t.Fatal(err)
	}
	e.assertEmpty()
}
