//go:build integration

package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

type forkJSON struct {
	Source   string  `json:"source"`
	Template string  `json:"template"`
	PauseMS  float64 `json:"pause_ms"`
	Children []struct {
		Name      string  `json:"name"`
		PID       int     `json:"pid"`
		State     string  `json:"state"`
		ReadyMS   float64 `json:"ready_ms"`
		RunningMS float64 `json:"running_ms"`
		Ports     []struct {
			Host  int `json:"host"`
			Guest int `json:"guest"`
		} `json:"ports"`
	} `json:"children"`
	Failed []struct {
		Name  string `json:"name"`
		Error string `json:"error"`
	} `json:"failed"`
}

func (e *env) counter(name string) int {
	e.t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(e.exec(name, "cat", "/run/counter")))
	if err != nil {
		e.t.Fatalf("counter of %s: %v", name, err)
	}
	return n
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestForkRunning is the heart of vmfork: a running source becomes four
// running machines that continue from the same instant and then diverge.
func TestForkRunning(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("src", "--port", "0:22")
	pid := strings.TrimSpace(e.exec("src", "vmfork-counter", "start"))
	time.Sleep(time.Second)
	// Written without sync just before the fork: it lives in the page cache
	// (guest RAM), not yet on the disk.
	e.exec("src", "sh", "-c", "echo unsynced-data > /data/unsynced; echo in-ram > /run/in-ram")
	before := e.counter("src")

	var res forkJSON
	e.jsonOK(&res, "fork", "src", "--count", "3")
	if res.Source != "src" || res.Template == "" || len(res.Children) != 3 || len(res.Failed) != 0 {
		t.Fatalf("fork result = %+v, want 3 children of src", res)
	}
	if res.PauseMS <= 0 || res.PauseMS > 5000 {
		t.Errorf("pause_ms = %v, want a measured pause", res.PauseMS)
	}
	for i, c := range res.Children {
		if want := "src-" + strconv.Itoa(i+1); c.Name != want || c.State != "running" || c.PID <= 0 || c.ReadyMS <= 0 {
			t.Errorf("child %d = %+v, want %s running with a pid and a ready time", i, c, want)
		}
		if len(c.Ports) != 1 || c.Ports[0].Guest != 22 || c.Ports[0].Host == 0 {
			t.Errorf("child %s ports = %+v, want its own host port for guest port 22", c.Name, c.Ports)
		}
	}
	after := e.counter("src")
	names := []string{"src-1", "src-2", "src-3"}

	tplRAM := filepath.Join(e.memDir, res.Template+".ram")
	sumAtFork := fileSHA256(t, tplRAM)

	for _, n := range names {
		if got := strings.TrimSpace(e.exec(n, "cat", "/run/counter.pid")); got != pid {
			t.Errorf("%s: counter pid %s, want the source's %s", n, got, pid)
		}
		if got := strings.TrimSpace(e.exec(n, "sh", "-c", "kill -0 $(cat /run/counter.pid) && echo alive")); got != "alive" {
			t.Errorf("%s: counter process not alive: %q", n, got)
		}
		c := e.counter(n)
		// It continued from the fork point: not restarted, not from the future.
		if c < before || c > after+50 {
			t.Errorf("%s: counter %d right after the fork, want it to continue from %d..%d", n, c, before, after)
		}
		if got := e.exec(n, "cat", "/data/unsynced", "/run/in-ram"); got != "unsynced-data\nin-ram\n" {
			t.Errorf("%s: files written before the fork = %q", n, got)
		}
	}

	// Each child goes on independently: stop the counter in one; the others
	// and the source keep counting.
	e.exec("src-1", "vmfork-counter", "stop")
	stopped := e.counter("src-1")
	c2, cs := e.counter("src-2"), e.counter("src")
	time.Sleep(1500 * time.Millisecond)
	if got := e.counter("src-1"); got != stopped {
		t.Errorf("src-1 counter moved from %d to %d after it was stopped there", stopped, got)
	}
	if got := e.counter("src-2"); got <= c2 {
		t.Errorf("src-2 counter %d did not advance from %d", got, c2)
	}
	if got := e.counter("src"); got <= cs {
		t.Errorf("source counter %d did not advance from %d", got, cs)
	}

	// Writes in one child, in RAM and on disk, are its own.
	e.exec("src-2", "sh", "-c", "echo mine > /run/child-only; echo mine > /data/child-only; sync")
	for _, n := range []string{"src", "src-1", "src-3"} {
		if r := e.vmfork("exec", n, "--", "sh", "-c", "cat /run/child-only /data/child-only 2>/dev/null"); r.stdout != "" {
			t.Errorf("%s sees src-2's files: %q", n, r.stdout)
		}
	}
	// The source writes too; no child sees it.
	e.exec("src", "sh", "-c", "echo parent > /data/parent-after; sync")
	if r := e.vmfork("exec", "src-3", "--", "cat", "/data/parent-after"); r.code == 0 {
		t.Errorf("src-3 sees a file the source wrote after the fork")
	}

	// Children dirty a lot of memory; the template RAM file never changes.
	for _, n := range names {
		e.exec(n, "sh", "-c", "dd if=/dev/urandom of=/run/big bs=1M count=24 2>/dev/null; sync")
	}
	if got := fileSHA256(t, tplRAM); got != sumAtFork {
		t.Errorf("template RAM file changed after children wrote memory")
	}

	ls := e.list()
	parents := map[string]string{}
	for _, m := range ls {
		parents[m.Name] = m.Parent + "/" + m.Template
	}
	for _, n := range names {
		if parents[n] != "src/"+res.Template {
			t.Errorf("ls: %s parent/template = %q, want src/%s", n, parents[n], res.Template)
		}
	}

	// Removing every child removes the template; the source runs on, its
	// disk no longer built on the template's frozen disk.
	e.ok(append([]string{"rm"}, names...)...)
	if _, err := os.Stat(tplRAM); !os.IsNotExist(err) {
		t.Errorf("template RAM file still there after its last child was removed: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(e.stateDir, "templates", "*")); len(left) != 0 {
		t.Errorf("templates left after the last child was removed: %v", left)
	}
	if got := e.exec("src", "cat", "/data/parent-after", "/data/unsynced"); got != "parent\nunsynced-data\n" {
		t.Errorf("source lost its data: %q", got)
	}
	e.exec("src", "sh", "-c", "echo later > /data/later; sync")
	if got := e.exec("src", "cat", "/data/later"); got != "later\n" {
		t.Errorf("source cannot write after its template went: %q", got)
	}
	e.ok("rm", "src")
	if left, _ := filepath.Glob(filepath.Join(e.stateDir, "templates", "*")); len(left) != 0 {
		t.Errorf("templates left after removing everything: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(e.memDir, "*")); len(left) != 0 {
		t.Errorf("RAM files left after removing everything: %v", left)
	}
}

// TestForkTwiceAndForkAChild forks one source twice (its disk chain grows
// under a running QEMU) and forks a child (whose RAM is private).
func TestForkTwiceAndForkAChild(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("p")
	e.exec("p", "sh", "-c", "echo one > /data/gen; sync")
	e.ok("fork", "p", "a")
	e.exec("p", "sh", "-c", "echo two > /data/gen; sync")
	e.ok("fork", "p", "b")
	e.exec("p", "sh", "-c", "echo three > /data/gen; sync")
	for name, want := range map[string]string{"a": "one\n", "b": "two\n", "p": "three\n"} {
		if got := e.exec(name, "cat", "/data/gen"); got != want {
			t.Errorf("%s: /data/gen = %q, want %q", name, got, want)
		}
	}
	// A fork of a fork.
	e.exec("a", "sh", "-c", "echo grand > /run/mark")
	e.ok("fork", "a", "a1")
	if got := e.exec("a1", "cat", "/data/gen", "/run/mark"); got != "one\ngrand\n" {
		t.Errorf("grandchild sees %q, want its parent's disk and RAM", got)
	}
	e.ok("rm", "a1", "a", "b", "p")
	if left, _ := filepath.Glob(filepath.Join(e.stateDir, "templates", "*")); len(left) != 0 {
		t.Errorf("templates left: %v", left)
	}
}

// TestForkStopped forks a stopped source: its children boot fresh from its disk.
func TestForkStopped(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("cold")
	e.exec("cold", "sh", "-c", "echo before-stop > /data/kept; sync")
	e.ok("stop", "cold")
	var res forkJSON
	e.jsonOK(&res, "fork", "cold", "--count", "2", "--prefix", "warm")
	if len(res.Children) != 2 || res.Children[0].Name != "warm-1" || res.Children[1].Name != "warm-2" {
		t.Fatalf("fork of a stopped source = %+v, want warm-1 and warm-2", res)
	}
	for _, n := range []string{"warm-1", "warm-2"} {
		if got := e.exec(n, "cat", "/data/kept"); got != "before-stop\n" {
			t.Errorf("%s: /data/kept = %q", n, got)
		}
		if r := e.vmfork("exec", n, "--", "cat", "/run/counter.pid"); r.code == 0 {
			t.Errorf("%s has RAM state from the source; it should have booted fresh", n)
		}
	}
	e.exec("warm-1", "sh", "-c", "echo w1 > /data/kept; sync")
	if got := e.exec("warm-2", "cat", "/data/kept"); got != "before-stop\n" {
		t.Errorf("warm-2 sees warm-1's write: %q", got)
	}
}

// TestForkBadInput checks that a fork that cannot be done says why, exits
// non-zero and changes nothing: the source keeps running, unpaused.
func TestForkBadInput(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("s")
	e.exec("s", "vmfork-counter", "start")
	e.boot("taken")
	cases := []struct {
		name string
		args []string
		code int
		says string
	}{
		{"unknown source", []string{"fork", "nope"}, 4, `machine "nope": not found`},
		{"name taken", []string{"fork", "s", "taken"}, 2, `machine "taken": already exists`},
		{"count zero", []string{"fork", "s", "--count", "0"}, 2, "--count 0"},
		{"over the limit", []string{"fork", "s", "--count", "3", "--max-children", "2"}, 2, "over the limit of 2"},
		{"bad child name", []string{"fork", "s", "Bad_Name"}, 2, `"Bad_Name" is not valid`},
		{"name twice", []string{"fork", "s", "x", "x"}, 2, "given twice"},
		{"no source", []string{"fork"}, 2, "needs a source"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.vmfork(c.args...)
			if r.code != c.code || !strings.Contains(r.stderr, c.says) {
				t.Errorf("got %s, want exit %d saying %q", r, c.code, c.says)
			}
			if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n != 0 {
				t.Errorf("error is %d lines, want one: %q", n+1, r.stderr)
			}
			if ms := e.list(); len(ms) != 2 {
				t.Errorf("machines after a refused fork: %+v, want s and taken only", ms)
			}
			if left, _ := filepath.Glob(filepath.Join(e.stateDir, "templates", "*")); len(left) != 0 {
				t.Errorf("a refused fork left templates: %v", left)
			}
		})
	}
	c := e.counter("s")
	time.Sleep(500 * time.Millisecond)
	if got := e.counter("s"); got <= c {
		t.Errorf("source counter stuck at %d after refused forks: left paused?", got)
	}

	// A stopped source whose disk is gone: a clear error, nothing changed.
	e.ok("stop", "s")
	var m []machineJSON
	e.jsonOK(&m, "ls")
	for _, x := range m {
		if x.Name == "s" {
			os.Remove(x.Disk)
		}
	}
	r := e.vmfork("fork", "s")
	if r.code == 0 || !strings.Contains(r.stderr, "disk.qcow2") {
		t.Errorf("fork of a stopped source without its disk: %s, want an error naming the disk", r)
	}
	if ms := e.list(); len(ms) != 2 {
		t.Errorf("machines after a refused fork: %+v", ms)
	}
}

// TestForkPartial makes one child's QEMU fail to start: the others stay, the
// failure is named, and the exit code is 3.
func TestForkPartial(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("s")
	stub := filepath.Join(t.TempDir(), "qemu-stub")
	script := "#!/bin/sh\ncase \"$*\" in *guest=s-2*) echo 'injected start failure' >&2; exit 1;; esac\nexec qemu-system-x86_64 \"$@\"\n"
	if err := os.WriteFile(stub, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := e.withEnv("VMFORK_QEMU="+stub).vmfork("fork", "s", "--count", "3", "--json")
	if r.code != 3 {
		t.Fatalf("partial fork: %s, want exit 3", r)
	}
	if !strings.Contains(r.stderr, "s-2") || !strings.Contains(r.stderr, "injected start failure") {
		t.Errorf("stderr does not name the failed child and QEMU's message: %q", r.stderr)
	}
	var res forkJSON
	if err := jsonDecode(r.stdout, &res); err != nil {
		t.Fatalf("stdout is not the fork JSON: %v: %q", err, r.stdout)
	}
	if len(res.Children) != 2 || len(res.Failed) != 1 || res.Failed[0].Name != "s-2" {
		t.Errorf("result = %+v, want s-1 and s-3 up and s-2 failed", res)
	}
	names := map[string]bool{}
	for _, m := range e.list() {
		names[m.Name] = m.State == "running"
	}
	if !names["s-1"] || !names["s-3"] || len(names) != 3 {
		t.Errorf("machines = %v, want s, s-1 and s-3 running and no s-2", names)
	}
	e.exec("s-3", "true")
}
