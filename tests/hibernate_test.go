//go:build integration

package tests

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

type hibernateJSON struct {
	Name         string  `json:"name"`
	State        string  `json:"state"`
	Template     string  `json:"template"`
	PauseMS      float64 `json:"pause_ms"`
	RAMFile      string  `json:"ram_file"`
	RAMBytes     int64   `json:"ram_bytes"`
	RAMSizeBytes int64   `json:"ram_size_bytes"`
}

// usage returns the bytes the files under dir occupy (their allocated
// blocks, what a tmpfs charges), skipping what vanishes meanwhile.
func usage(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) == nil {
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}

// TestHibernateResume: a machine with a counter running, hibernated, has no
// QEMU and its RAM is out of the mem dir (on disk, sparse); a fork of it
// leaves it hibernated and its child runs on from the instant; resumed, the
// same counter process continues with the machine's name, MAC and guest
// identity unchanged and its clock stepped to the host's; hibernated again
// and removed, nothing of it is left.
func TestHibernateResume(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("src")
	e.exec("src", "vmfork-counter", "start")
	e.waitCounter("src", 5)
	before := e.machine("src")
	guestID := func(name string) string {
		return e.exec(name, "sh", "-c", "hostname; cat /sys/class/net/e*/address /etc/machine-id")
	}
	id := guestID("src")
	counterPID := strings.TrimSpace(e.exec("src", "cat", "/run/counter.pid"))
	memBefore := usage(t, e.memDir)
	c0 := e.counter("src")

	// Bad input and dry runs change nothing.
	if r := e.vmfork("resume", "src"); r.code != 2 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("resume of a running machine: %s, want exit 2 and one line", r)
	}
	var plan struct {
		DryRun  bool     `json:"dry_run"`
		Actions []string `json:"actions"`
	}
	e.jsonOK(&plan, "hibernate", "src", "--dry-run")
	if !plan.DryRun || len(plan.Actions) == 0 || e.machine("src").State != "running" {
		t.Errorf("hibernate --dry-run: %+v; src %+v, want it running still", plan, e.machine("src"))
	}
	var h hibernateJSON
	e.jsonOK(&h, "hibernate", "src")
	memAfter := usage(t, e.memDir)
	t.Logf("hibernate: %+v; mem dir %d -> %d bytes", h, memBefore, memAfter)
	if h.Name != "src" || h.State != "hibernated" || h.RAMSizeBytes != 256<<20 || !strings.HasPrefix(h.RAMFile, e.stateDir) {
		t.Errorf("hibernate = %+v, want src hibernated with its 256 MiB of RAM under the state dir", h)
	}
	if pids := e.qemuProcesses(); len(pids) != 0 {
		t.Errorf("QEMU processes after hibernate: %v, want none", pids)
	}
	// The mem dir held the RAM the guest touched; all of it is gone.
	if memBefore < 16<<20 || memAfter > 1<<20 {
		t.Errorf("mem dir held %d bytes before the hibernate and %d after: want the machine's RAM gone from it", memBefore, memAfter)
	}
	if disk := usage(t, h.RAMFile); disk > memBefore || disk < h.RAMBytes {
		t.Errorf("RAM file on disk occupies %d bytes, stores %d; the mem dir held %d: want it sparse", disk, h.RAMBytes, memBefore)
	}
	if m := e.machine("src"); m.State != "hibernated" || m.PID != 0 {
		t.Errorf("ls shows %+v, want src hibernated with no pid", m)
	}
	if r := e.vmfork("exec", "src", "--", "true"); r.code == 0 {
		t.Errorf("exec in a hibernated machine: %s, want a refusal", r)
	}
	if r := e.vmfork("stop", "src"); r.code != 2 {
		t.Errorf("stop of a hibernated machine: %s, want exit 2", r)
	}
	time.Sleep(3 * time.Second) // the guest's clock stands still meanwhile

	var fr struct {
		Children []struct {
			Name string `json:"name"`
		} `json:"children"`
	}
	e.jsonOK(&fr, "fork", "src", "--count", "1")
	if len(fr.Children) != 1 {
		t.Fatalf("fork of hibernated src: %+v", fr)
	}
	child := fr.Children[0].Name
	if n := e.counter(child); n < c0 {
		t.Errorf("child's counter %d, want it to go on from the hibernate's %d", n, c0)
	}
	e.counterAdvances(child)
	if m := e.machine("src"); m.State != "hibernated" || m.PID != 0 {
		t.Errorf("after the fork src is %+v, want it hibernated", m)
	}
	e.ok("rm", child)
	if m := usage(t, e.memDir); m > 1<<20 {
		t.Errorf("mem dir holds %d bytes once the child is gone, want the RAM freed again", m)
	}

	var rr struct {
		Name    string  `json:"name"`
		PID     int     `json:"pid"`
		ReadyMS float64 `json:"ready_ms"`
	}
	e.jsonOK(&rr, "resume", "src")
	t.Logf("resume: %+v", rr)
	if n := e.counter("src"); n < c0 || n > c0+50 {
		t.Errorf("counter %d after the resume, want it to go on from the hibernate's %d", n, c0)
	}
	e.counterAdvances("src")
	if got := strings.TrimSpace(e.exec("src", "cat", "/run/counter.pid")); got != counterPID {
		t.Errorf("counter process %s after the resume, was %s: want the same process", got, counterPID)
	}
	if got := guestID("src"); got != id {
		t.Errorf("the guest's hostname, MAC and machine-id are %q after the resume, were %q", got, id)
	}
	m := e.machine("src")
	if m.Name != "src" || m.MAC != before.MAC || m.State != "running" || m.PID != rr.PID || m.PID == before.PID {
		t.Errorf("after the resume %+v, before %+v: want the same name and MAC, a new process", m, before)
	}
	if off := e.guestClockOffset("src"); off > 2*time.Second || off < -2*time.Second {
		t.Errorf("guest clock %v off the host's after the resume, want it stepped", off)
	}
	if _, err := os.Stat(h.RAMFile); !os.IsNotExist(err) {
		t.Errorf("RAM file on disk after the resume: %v, want it removed", err)
	}

	e.ok("hibernate", "src")
	e.ok("rm", "src")
	if pids := e.qemuProcesses(); len(pids) != 0 {
		t.Errorf("QEMU processes after rm: %v", pids)
	}
	for _, d := range []string{filepath.Join(e.stateDir, "machines"), filepath.Join(e.stateDir, "templates"), e.memDir} {
		if es, _ := os.ReadDir(d); len(es) != 0 {
			t.Errorf("%s after rm of the hibernated machine: %d entries left", d, len(es))
		}
	}
}
