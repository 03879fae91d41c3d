//go:build integration

package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

type templateJSON struct {
	Name      string `json:"name"`
	ID        string `json:"id"`
	Source    string `json:"source"`
	HasMemory bool   `json:"has_memory"`
	RAMBytes  int64  `json:"ram_bytes"`
	Children  int    `json:"children"`
	PoolSize  int    `json:"pool_size"`
	Pooled    int    `json:"pooled"`
}

// poolPIDs returns the QEMU pids of the warm-pool members in the state dir.
func (e *env) poolPIDs() []int {
	e.t.Helper()
	files, _ := filepath.Glob(filepath.Join(e.stateDir, "pool", "*", "*", "member.json"))
	var pids []int
	for _, f := range files {
		var m struct {
			PID int `json:"pid"`
		}
		data, err := os.ReadFile(f)
		if err != nil || json.Unmarshal(data, &m) != nil {
			e.t.Fatalf("pool member %s unreadable: %v", f, err)
		}
		pids = append(pids, m.PID)
	}
	return pids
}

func (e *env) template(name string) templateJSON {
	e.t.Helper()
	var ts []templateJSON
	e.jsonOK(&ts, "template", "ls")
	for _, t := range ts {
		if t.Name == name {
			return t
		}
	}
	e.t.Fatalf("template ls: no template named %s in %+v", name, ts)
	return templateJSON{}
}

// TestKeptTemplateWithPool keeps a running machine's instant, forks children
// from it later (the first ones from the warm pool), and gives it up.
func TestKeptTemplateWithPool(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("src")
	e.exec("src", "vmfork-counter", "start")
	time.Sleep(time.Second)
	e.exec("src", "sh", "-c", "echo saved > /run/at-save; echo on-disk > /data/at-save")
	before := e.counter("src")

	var saved templateJSON
	e.jsonOK(&saved, "template", "save", "src", "golden", "--pool", "2")
	if saved.Name != "golden" || saved.Source != "src" || !saved.HasMemory || saved.PoolSize != 2 || saved.Pooled != 2 {
		t.Fatalf("template save = %+v, want golden of src with memory and 2 pooled", saved)
	}
	pool := e.poolPIDs()
	if len(pool) != 2 {
		t.Fatalf("pool pids = %v, want 2", pool)
	}
	// The source runs on, and what it does now is not in the template.
	e.exec("src", "sh", "-c", "echo later > /run/after-save; echo later > /data/after-save; sync")
	time.Sleep(500 * time.Millisecond)

	var res forkJSON
	e.jsonOK(&res, "fork", "golden", "--count", "3")
	if res.Source != "golden" || res.Template != saved.ID || len(res.Children) != 3 || len(res.Failed) != 0 {
		t.Fatalf("fork golden = %+v, want 3 children of template %s", res, saved.ID)
	}
	afterFork := e.counter("src")
	var fromPool int
	for _, c := range res.Children {
		if slices.Contains(pool, c.PID) {
			fromPool++
			// A guest reset shows the NIC's configured MAC: a pooled
			// child's must be its own, not the template's.
			mac, srcMAC := e.machine(c.Name).MAC, e.machine("src").MAC
			if nic := e.nicConfiguredMAC(c.Name); !strings.EqualFold(nic, mac) || strings.EqualFold(nic, srcMAC) {
				t.Errorf("%s (from the pool): NIC configured with %s, child's MAC %s, source's %s; want the child's own",
					c.Name, nic, mac, srcMAC)
			}
		}
		if got := e.exec(c.Name, "cat", "/run/at-save", "/data/at-save"); got != "saved\non-disk\n" {
			t.Errorf("%s: files of the saved instant = %q", c.Name, got)
		}
		if r := e.vmfork("exec", c.Name, "--", "cat", "/run/after-save"); r.code == 0 || strings.Contains(r.stdout, "later") {
			t.Errorf("%s sees RAM the source wrote after the save", c.Name)
		}
		if r := e.vmfork("exec", c.Name, "--", "cat", "/data/after-save"); r.code == 0 {
			t.Errorf("%s sees a file the source wrote after the save", c.Name)
		}
		// The counter continues from the saved instant, not from the
		// source's present.
		if n := e.counter(c.Name); n < before || n > afterFork+50 {
			t.Errorf("%s: counter %d, want it to continue from %d (the save)", c.Name, n, before)
		}
	}
	if fromPool != 2 {
		t.Errorf("%d children run in the pool's processes %v, want 2", fromPool, pool)
	}
	ids := map[string]bool{}
	for _, c := range res.Children {
		ids[strings.TrimSpace(e.exec(c.Name, "cat", "/etc/machine-id"))] = true
	}
	if len(ids) != 3 {
		t.Errorf("children share machine-ids: %v", ids)
	}
	if got := e.template("golden"); got.Pooled != 2 || got.Children != 3 {
		t.Errorf("after the fork: %+v, want the pool refilled to 2 and 3 children", got)
	}

	// A child that came from the pool forks like any machine: its disk
	// becomes a backing image under the name QEMU knows.
	e.exec("golden-1", "sh", "-c", "echo grand > /data/mark; sync")
	e.ok("fork", "golden-1", "grandchild")
	if got := e.exec("grandchild", "cat", "/data/mark", "/run/at-save"); got != "grand\nsaved\n" {
		t.Errorf("grandchild sees %q", got)
	}

	// A pool process that died is skipped, not handed out, and replaced.
	pool = e.poolPIDs()
	if len(pool) != 2 {
		t.Fatalf("pool pids = %v, want 2 after the refill", pool)
	}
	if err := syscall.Kill(pool[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExit(pool[0], e.stateDir, 10*time.Second)
	var more forkJSON
	e.jsonOK(&more, "fork", "golden", "after-kill")
	if len(more.Children) != 1 || more.Children[0].PID != pool[1] {
		t.Errorf("fork after a pool process died = %+v, want it from the live one (pid %d)", more, pool[1])
	}
	if got := e.template("golden"); got.Pooled != 2 {
		t.Errorf("pool after the fork: %d live, want 2 again", got.Pooled)
	}
	e.ok("rm", "after-kill")

	// Bad input changes nothing.
	if r := e.vmfork("template", "save", "src", "golden"); r.code != 2 {
		t.Errorf("second template named golden: %s, want exit 2", r)
	}
	if r := e.vmfork("template", "save", "src", "golden-2"); r.code != 2 {
		t.Errorf("template named like a machine: %s, want exit 2", r)
	}
	if r := e.vmfork("template", "save", "nope", "x"); r.code != 4 {
		t.Errorf("template of an unknown machine: %s, want exit 4", r)
	}
	if r := e.vmfork("template", "pool", "nope", "1"); r.code != 4 {
		t.Errorf("pool of an unknown template: %s, want exit 4", r)
	}

	// Given up: the pool stops at once; the files stay for the children.
	pool = e.poolPIDs()
	e.ok("template", "rm", "golden")
	for _, pid := range pool {
		if !waitExit(pid, e.stateDir, 10*time.Second) {
			t.Errorf("pool process %d still runs after template rm", pid)
		}
	}
	if r := e.vmfork("fork", "golden"); r.code != 4 {
		t.Errorf("fork of a removed template: %s, want exit 4", r)
	}
	e.ok("rm", "grandchild", "golden-1", "golden-2", "golden-3", "src")
	if left, _ := filepath.Glob(filepath.Join(e.stateDir, "templates", "*")); len(left) != 0 {
		t.Errorf("templates left after removing everything: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(e.stateDir, "pool", "*")); len(left) != 0 {
		t.Errorf("pool files left after removing everything: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(e.memDir, "*")); len(left) != 0 {
		t.Errorf("RAM files left: %v", left)
	}
	if pids := e.qemuProcesses(); len(pids) != 0 {
		t.Errorf("QEMU processes left: %v", pids)
	}
}
