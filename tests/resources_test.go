//go:build integration

package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMemDirFull forks a source whose mem dir (a small tmpfs of its own) is
// full: the freeze needs room there for a copy of the source's RAM base, as
// every fork after a machine's first does. The fork fails with one line that
// names the mem dir, the source keeps running, nothing half-made stays, and
// forks work again once there is room.
func TestMemDirFull(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.mountTmpfs(300 << 20)
	e.boot("src")
	// The first fork needs no room in the mem dir: the source's own RAM
	// file becomes the template and the source is remapped privately.
	e.ok("fork", "src", "first")
	filler := e.fill(e.memDir, 1<<20)

	before := e.snapshot()
	r := e.vmfork("-q", "fork", "src", "--count", "2")
	e.checkFullFailure("freeze", r, "mem dir "+e.memDir+" is full", before)

	// A burst of forks at once on the full mem dir: each fails the same way.
	rs := e.concurrently([]cmdSpec{{"fork", "src", "b-1"}, {"fork", "src", "b-2"}, {"fork", "first", "b-3"}, {"template", "save", "src", "keep"}})
	for _, r := range rs {
		e.checkFullFailure("burst: "+r.args, r.result, "mem dir "+e.memDir+" is full", before)
	}

	os.Remove(filler)
	e.ok("fork", "src", "after")
	e.exec("after", "true")
}

// TestStateDirFull forks a source whose state dir (a small loop-mounted ext4
// of its own) is full, first with no room at all (the device-state save fails
// in the pause), then a burst of eight children from a kept template with
// room for about two. Errors are one line naming the state dir; the source keeps
// running; every machine left is whole (recorded, running, its agent answers)
// and no QEMU runs without a record.
func TestStateDirFull(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.mountLoopExt4(96 << 20)
	e.boot("src")

	filler := e.fill(e.stateDir, 64<<10)
	before := e.snapshot()
	r := e.vmfork("-q", "fork", "src", "--count", "2")
	e.checkFullFailure("freeze", r, "state dir "+e.stateDir+" is full", before)
	os.Remove(filler)

	// A burst from a kept template makes no freeze: only the children's
	// records, overlays and logs need room, here for about two of eight.
	e.ok("template", "save", "src", "keep")
	one, two := e.forkCost("keep", "p1"), e.forkCost("keep", "p2", "p3")
	child := max(two-one, 4<<10)
	// Room for two children's worth fails the reservation of all eight;
	// room for five got further, into making the children, before
	// admission (admission.go) refused both up front: the check is that
	// either way the error names the state dir and leaves only whole
	// machines.
	for _, n := range []int64{2, 5} {
		label := fmt.Sprintf("burst with room for %d", n)
		filler = e.fill(e.stateDir, n*child)
		r = e.vmfork("-q", "fork", "keep", "--count", "8", "--json")
		t.Logf("%s (%d KiB, a child takes about %d KiB): exit %d, %s", label, n*child>>10, child>>10, r.code, r.stderr)
		if r.code == 0 {
			t.Errorf("%s: eight children succeeded, want a full state dir", label)
		} else if !strings.Contains(r.stderr, "state dir "+e.stateDir+" is full") {
			t.Errorf("%s: error does not name the full state dir: %s", label, r.stderr)
		}
		e.checkWhole(label, r)
		os.Remove(filler)
		e.rmAllBut("src")
	}
	e.ok("fork", "src", "after")
	e.exec("after", "true")
}

// forkCost forks src into children names, returns what that took in the
// state dir and removes them.
func (e *env) forkCost(src string, names ...string) int64 {
	e.t.Helper()
	free := freeBytes(e.t, e.stateDir)
	e.ok(append([]string{"fork", src}, names...)...)
	unix.Sync()
	cost := free - freeBytes(e.t, e.stateDir)
	e.ok(append([]string{"rm"}, names...)...)
	return cost
}

// rmAllBut removes every machine but keep.
func (e *env) rmAllBut(keep string) {
	e.t.Helper()
	args := []string{"rm"}
	for _, m := range e.list() {
		if m.Name != keep {
			args = append(args, m.Name)
		}
	}
	if len(args) > 1 {
		e.ok(args...)
	}
}

// mountTmpfs mounts a tmpfs of size bytes on the env's mem dir, unmounted
// when the test ends, after every QEMU of the env is gone.
func (e *env) mountTmpfs(size int64) {
	e.t.Helper()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.FormatInt(size, 10)+",mode=0700",
		"vmfork-test", e.memDir).CombinedOutput(); err != nil {
		e.t.Fatalf("mount tmpfs on %s: %v: %s", e.memDir, err, out)
	}
	e.t.Cleanup(func() { e.cleanup(); unmount(e.t, e.memDir) })
}

// mountLoopExt4 mounts an ext4 of size bytes, in a file of its own, on the
// env's state dir (with no blocks reserved for root, who runs the tests).
func (e *env) mountLoopExt4(size int64) {
	e.t.Helper()
	img := filepath.Join(e.t.TempDir(), "state.ext4")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		e.t.Fatal(err)
	}
	for _, argv := range [][]string{{"mkfs.ext4", "-q", "-m", "0", img}, {"mount", "-o", "loop", img, e.stateDir}} {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			e.t.Fatalf("%v: %v: %s", argv, err, out)
		}
	}
	e.t.Cleanup(func() { e.cleanup(); unmount(e.t, e.stateDir) })
}

// unmount unmounts dir, retrying while a QEMU that was just killed still
// holds it.
func unmount(t testing.TB, dir string) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := unix.Unmount(dir, 0)
		if err == nil || time.Now().After(deadline) {
			if err != nil {
				t.Errorf("unmount %s: %v", dir, err)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freeBytes(t testing.TB, dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatalf("statfs %s: %v", dir, err)
	}
	return int64(st.Bavail) * st.Bsize
}

// fill allocates a file in dir that leaves about free bytes free, and
// returns its path.
func (e *env) fill(dir string, free int64) string {
	e.t.Helper()
	path := filepath.Join(dir, "filler")
	n := freeBytes(e.t, dir) - free
	if out, err := exec.Command("fallocate", "-l", strconv.FormatInt(n, 10), path).CombinedOutput(); err != nil {
		e.t.Fatalf("fill %s: %v: %s", dir, err, out)
	}
	return path
}

// dirState is what a failed command must leave as it was.
type dirState struct {
	machines, templates, memFiles, qemus string
}

func (e *env) snapshot() dirState {
	e.t.Helper()
	var names []string
	for _, m := range e.list() {
		names = append(names, m.Name+"="+m.State)
	}
	var tpls []struct {
		ID        string `json:"id"`
		HasMemory bool   `json:"has_memory"`
	}
	e.jsonOK(&tpls, "template", "ls")
	var ids []string
	for _, tp := range tpls {
		if tp.HasMemory {
			ids = append(ids, tp.ID)
		}
	}
	var mem []string
	ents, _ := os.ReadDir(e.memDir)
	for _, ent := range ents {
		mem = append(mem, ent.Name())
	}
	return dirState{strings.Join(names, " "), strings.Join(ids, " "), strings.Join(mem, " "), strconv.Itoa(len(e.qemuProcesses()))}
}

// checkFullFailure checks a command that ran out of room: it failed with one
// line naming what is full; machines, templates with memory, mem-dir files
// and QEMU processes are as before; the source answers and is not paused.
func (e *env) checkFullFailure(label string, r result, want string, before dirState) {
	t := e.t
	t.Helper()
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	switch {
	case r.code == 0:
		t.Errorf("%s: succeeded, want a failure: %s", label, r)
	case len(lines) != 1 || !strings.HasPrefix(lines[0], "vmfork: "):
		t.Errorf("%s: not a one-line error: %s", label, r)
	case !strings.Contains(lines[0], want):
		t.Errorf("%s: error does not say %q: %s", label, want, lines[0])
	default:
		t.Logf("%s: %s", label, lines[0])
	}
	if after := e.snapshot(); after != before {
		t.Errorf("%s: left something behind:\n got %+v\nwant %+v", label, after, before)
	}
	e.checkLive(label, []string{"src"})
	for _, ent := range mustReadDir(t, filepath.Join(e.stateDir, "journal")) {
		t.Errorf("%s: journal entry %s left", label, ent.Name())
	}
}

// checkWhole checks that a partly failed burst left only whole machines: each
// child it reports is listed and answers; every other machine is as before.
func (e *env) checkWhole(label string, r result) {
	t := e.t
	t.Helper()
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	if r.code != 0 && (len(lines) != 1 || !strings.HasPrefix(lines[0], "vmfork: ")) {
		t.Errorf("%s: not a one-line error: %s", label, r)
	}
	var res struct {
		Children []struct {
			Name string `json:"name"`
		} `json:"children"`
	}
	if r.stdout != "" {
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Errorf("%s: stdout is not JSON: %v\n%s", label, err, r.stdout)
		}
	}
	e.checkLive(label, []string{"src"})
	for _, c := range res.Children {
		e.exec(c.Name, "true")
	}
	for _, ent := range mustReadDir(t, filepath.Join(e.stateDir, "journal")) {
		t.Errorf("%s: journal entry %s left", label, ent.Name())
	}
	// Half-made children leave no directory without a record.
	for _, ent := range mustReadDir(t, filepath.Join(e.stateDir, "machines")) {
		if _, err := os.Stat(filepath.Join(e.stateDir, "machines", ent.Name(), "machine.json")); err != nil {
			t.Errorf("%s: machine dir %s has no record: %v", label, ent.Name(), err)
		}
	}
	t.Logf("%s: %d children came up", label, len(res.Children))
}

func mustReadDir(t testing.TB, dir string) []os.DirEntry {
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Errorf("read %s: %v", dir, err)
	}
	return ents
}
