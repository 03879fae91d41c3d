//go:build integration

package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmfork/vmfork/internal/proc"
)

// reaperPIDs lists the live vmfork reaper processes of this env's state dir.
func (e *env) reaperPIDs() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + ent.Name() + "/cmdline")
		args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
		if err == nil && len(args) > 1 && bytes.Equal(args[len(args)-1], []byte("reaper")) &&
			bytes.Contains(cmdline, []byte(e.stateDir)) && proc.Running(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stopReapersOnCleanup kills this env's reapers when the test ends, before
// the env's own cleanup kills its QEMUs (cleanups run last first).
func (e *env) stopReapersOnCleanup() {
	e.t.Cleanup(func() {
		for _, pid := range e.reaperPIDs() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// waitFor polls cond every 100 ms until it holds or d has passed.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// startKilledAfterResult runs vmfork with --json, and kills it with SIGKILL
// the moment its result is on stdout, before it has exited by itself. It
// returns the decoded result.
func (e *env) startKilledAfterResult(v any, args ...string) {
	e.t.Helper()
	cmd := exec.Command(e.bin, append([]string{"--state-dir", e.stateDir, "--mem-dir", e.memDir}, append(args, "--json")...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	derr := json.NewDecoder(out).Decode(v)
	cmd.Process.Kill()
	cmd.Wait()
	if derr != nil {
		e.t.Fatalf("vmfork %s: no JSON result: %v; stderr %s", strings.Join(args, " "), derr, stderr.String())
	}
}

func alive(pid int) bool { return proc.Running(pid) }

func (e *env) templateDirs() []string {
	es, _ := os.ReadDir(filepath.Join(e.stateDir, "templates"))
	var ids []string
	for _, d := range es {
		ids = append(ids, d.Name())
	}
	return ids
}

// A child with a TTL goes at its deadline although the CLI that forked it
// was killed and no vmfork command runs; its template goes with it, the
// machine without a TTL stays, and the reaper leaves nothing behind.
func TestTTLReapsWithoutAClient(t *testing.T) {
	e := newEnv(t)
	e.stopReapersOnCleanup()
	src := e.boot("src")
	var fr struct {
		Template string `json:"template"`
		Children []struct {
			Name string `json:"name"`
			PID  int    `json:"pid"`
		} `json:"children"`
	}
	e.startKilledAfterResult(&fr, "fork", "src", "kid", "--ttl", "3s")
	forked := time.Now()
	if len(fr.Children) != 1 || fr.Children[0].PID == 0 {
		t.Fatalf("fork result %+v, want kid", fr)
	}
	kid := fr.Children[0].PID
	// The deadline was set when kid's record was made, before the fork
	// returned: it has passed by 5 s at forked+8s at the latest. No vmfork
	// command runs until then.
	gone := waitFor(3*time.Second+5*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(e.stateDir, "machines", "kid"))
		return !alive(kid) && os.IsNotExist(err)
	})
	if !gone {
		t.Fatalf("kid (pid %d) still there %s after its fork, 5 s past its deadline", kid, time.Since(forked).Round(time.Millisecond))
	}
	t.Logf("kid removed %s after the fork (ttl 3s)", time.Since(forked).Round(100*time.Millisecond))
	if !waitFor(30*time.Second, func() bool { return !slices.Contains(e.templateDirs(), fr.Template) }) {
		t.Errorf("template %s still there after its only child expired: %v", fr.Template, e.templateDirs())
	}
	if !waitFor(10*time.Second, func() bool { return len(e.reaperPIDs()) == 0 }) {
		t.Errorf("reaper still runs with nothing to reap: %v", e.reaperPIDs())
	}
	if !alive(src.PID) {
		t.Errorf("src (no TTL) was touched: its QEMU is gone")
	}
	ms := e.list()
	if len(ms) != 1 || ms[0].Name != "src" || ms[0].State != "running" {
		t.Errorf("machines = %+v, want src running alone", ms)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "reaper.qemu.pid")); !os.IsNotExist(err) {
		t.Errorf("reaper PID file left: %v", err)
	}

	// Removed early, a machine with a TTL leaves the reaper nothing to do:
	// it exits, and ls shows the deadline while there is one.
	e.ok("fork", "src", "early", "--ttl", "1h")
	var withTTL []struct {
		Name     string  `json:"name"`
		Expires  string  `json:"expires"`
		TTLLeftS float64 `json:"ttl_left_s"`
	}
	e.jsonOK(&withTTL, "ls")
	i := slices.IndexFunc(withTTL, func(m struct {
		Name     string  `json:"name"`
		Expires  string  `json:"expires"`
		TTLLeftS float64 `json:"ttl_left_s"`
	}) bool {
		return m.Name == "early"
	})
	if i < 0 || withTTL[i].Expires == "" || withTTL[i].TTLLeftS < 3500 || withTTL[i].TTLLeftS > 3600 {
		t.Errorf("ls --json = %+v, want early with about an hour left", withTTL)
	}
	if len(e.reaperPIDs()) != 1 {
		t.Fatalf("reapers = %v, want one for early's deadline", e.reaperPIDs())
	}
	e.ok("extend", "early", "--ttl", "2h")
	e.ok("rm", "early")
	if !waitFor(10*time.Second, func() bool { return len(e.reaperPIDs()) == 0 }) {
		t.Errorf("reaper still runs after the only machine with a TTL was removed: %v", e.reaperPIDs())
	}
	if pids := e.qemuProcesses(); len(pids) != 1 || pids[0] != src.PID {
		t.Errorf("QEMU processes %v, want src's (%d) alone", pids, src.PID)
	}
}

type exploreJSON struct {
	Winner    string `json:"winner"`
	WinnerTry int    `json:"winner_try"`
	Kept      []string
	Removed   []string `json:"removed"`
	Tries     []struct {
		Index    int      `json:"index"`
		Branch   string   `json:"branch"`
		ExitCode int      `json:"exit_code"`
		TimedOut bool     `json:"timed_out"`
		Stdout   string   `json:"stdout_tail"`
		Changed  []string `json:"changed"`
		Kept     bool     `json:"kept"`
	} `json:"tries"`
}

// Four tries: one fails, one hangs past its timeout, one passes slowly and
// one passes fast. The fast one is kept, with its changes; no other QEMU
// and no other machine is left.
func TestExploreKeepsTheFastWinner(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.stopReapersOnCleanup()
	src := e.boot("src")
	var res exploreJSON
	e.jsonOK(&res, "explore", "src",
		"--try", "echo broken >&2; exit 3",
		"--try", "sleep 600",
		"--try", "sleep 8; mkdir -p /data/w; echo slow > /data/w/slow",
		"--try", "mkdir -p /data/w; echo fast > /data/w/fast; echo done",
		"--try-timeout", "25s", "--watch", "/data/w", "--keep-as", "best")
	if res.Winner != "best" || res.WinnerTry != 4 {
		t.Fatalf("winner %q from try %d, want best from try 4: %+v", res.Winner, res.WinnerTry, res)
	}
	tr := res.Tries
	if len(tr) != 4 || tr[0].ExitCode != 3 || !tr[1].TimedOut || tr[2].ExitCode != 0 || tr[3].ExitCode != 0 {
		t.Errorf("tries = %+v, want exit 3, a timeout, two passes", tr)
	}
	if !slices.Equal(tr[3].Changed, []string{"A /data/w/fast"}) || !slices.Equal(tr[2].Changed, []string{"A /data/w/slow"}) {
		t.Errorf("changed: slow %v, fast %v; want each its own file", tr[2].Changed, tr[3].Changed)
	}
	if got := strings.TrimSpace(e.exec("best", "cat", "/data/w/fast")); got != "fast" {
		t.Errorf("best's /data/w/fast = %q, want the winner's change", got)
	}
	if r := e.vmfork("exec", "best", "--", "test", "-e", "/data/w/slow"); r.code == 0 {
		t.Errorf("best has the slow try's file too")
	}
	var names []string
	for _, m := range e.list() {
		names = append(names, m.Name)
	}
	if strings.Join(names, ",") != "best,src" {
		t.Errorf("machines = %v, want best,src", names)
	}
	if pids := e.qemuProcesses(); len(pids) != 2 {
		t.Errorf("QEMU processes %v, want src's and best's", pids)
	}
	for _, tr := range res.Tries {
		if _, err := os.Stat(filepath.Join(e.stateDir, "machines", tr.Branch)); !os.IsNotExist(err) {
			t.Errorf("branch %s's directory is left: %v", tr.Branch, err)
		}
	}
	if rs, _ := filepath.Glob(filepath.Join(e.stateDir, "explore", "*.json")); len(rs) != 0 {
		t.Errorf("explore records left: %v", rs)
	}
	if !alive(src.PID) {
		t.Errorf("the source's QEMU is gone")
	}
}

// An explore killed while its tries run leaves its branches to the reaper,
// which removes every one of them with no vmfork command run.
func TestExploreKilledMidWayLeavesNoBranch(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.stopReapersOnCleanup()
	src := e.boot("src")
	cmd := exec.Command(e.bin, "--state-dir", e.stateDir, "--mem-dir", e.memDir,
		"explore", "src", "--try", "sleep 600", "--try", "sleep 601", "--try-timeout", "10m", "--trace-json")
	// A file, not a buffer: the test reads it while vmfork writes it.
	logPath := filepath.Join(t.TempDir(), "explore.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stderr = logf
	stderr := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	// Kill it once both branches are ready (its trace says so) and run
	// their tries.
	if !waitFor(3*time.Minute, func() bool { return len(traceEvents(stderr(), "child_ready")) == 2 }) {
		t.Fatalf("branches did not come up; stderr: %s", stderr())
	}
	time.Sleep(time.Second)
	cmd.Process.Kill()
	cmd.Wait()
	killed = true
	if n := len(e.qemuProcesses()); n != 3 {
		t.Fatalf("%d QEMU processes after the kill, want src and two branches", n)
	}
	if !waitFor(time.Minute, func() bool { return len(e.qemuProcesses()) == 1 }) {
		t.Fatalf("branches still run a minute after their explore was killed: %v", e.qemuProcesses())
	}
	ms := e.list()
	if len(ms) != 1 || ms[0].Name != "src" || ms[0].PID != src.PID {
		t.Errorf("machines = %+v, want src alone", ms)
	}
	if !waitFor(10*time.Second, func() bool { return len(e.reaperPIDs()) == 0 }) {
		t.Errorf("reaper still runs: %v", e.reaperPIDs())
	}
}

type treeNodeJSON struct {
	Kind     string          `json:"kind"`
	Name     string          `json:"name"`
	State    string          `json:"state"`
	RAM      int64           `json:"ram_bytes"`
	Children []*treeNodeJSON `json:"children"`
}

// shape writes a tree as "name(kind)[children]".
func (n *treeNodeJSON) shape() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s(%s)", n.Name, n.Kind)
	if len(n.Children) > 0 {
		var cs []string
		for _, c := range n.Children {
			cs = append(cs, c.shape())
		}
		b.WriteString("[" + strings.Join(cs, " ") + "]")
	}
	return b.String()
}

// Source → template → child → template → grandchild, shown correctly also
// after the middle machine was removed.
func TestTreeThreeLevels(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("base")
	e.ok("fork", "base", "kid")
	e.ok("fork", "kid", "grand")
	var tr struct {
		Roots []*treeNodeJSON `json:"roots"`
	}
	e.jsonOK(&tr, "tree")
	want := "base(machine)[base.1(template)[kid(machine)[kid.1(template)[grand(machine)]]]]"
	if len(tr.Roots) != 1 || tr.Roots[0].shape() != want {
		t.Fatalf("tree = %v, want %s", shapes(tr.Roots), want)
	}
	if tr.Roots[0].RAM == 0 {
		t.Errorf("base holds no RAM of its own: %+v", tr.Roots[0])
	}
	e.ok("rm", "kid")
	e.jsonOK(&tr, "tree", "grand")
	want = "base(machine)[base.1(template)[kid(removed)[kid.1(template)[grand(machine)]]]]"
	if len(tr.Roots) != 1 || tr.Roots[0].shape() != want {
		t.Errorf("tree after kid was removed = %v, want %s", shapes(tr.Roots), want)
	}
	text := e.ok("tree").stdout
	if !strings.Contains(text, "kid  removed") || !strings.Contains(text, "grand  running") || !strings.Contains(text, "sharing saves") {
		t.Errorf("tree text:\n%s", text)
	}
}

func shapes(ns []*treeNodeJSON) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.shape())
	}
	return out
}

// Explore works on a kept template; the template's own TTL gives its name
// up with no command run, and it goes when its last child goes.
func TestExploreFromAKeptTemplateWithTTL(t *testing.T) {
	e := newEnv(t)
	e.stopReapersOnCleanup()
	src := e.boot("src")
	e.exec("src", "sh", "-c", "echo saved > /data/at-save; sync")
	var saved templateJSON
	e.jsonOK(&saved, "template", "save", "src", "gold", "--ttl", "20s")
	var res exploreJSON
	e.jsonOK(&res, "explore", "gold", "--try", "exit 1", "--try", "cat /data/at-save")
	if res.Winner != "gold-try-2" || strings.TrimSpace(res.Tries[1].Stdout) != "saved" {
		t.Fatalf("explore of a kept template = %+v, want gold-try-2 reading the saved file", res)
	}
	// No vmfork command until the template's name is given up.
	manifest := filepath.Join(e.stateDir, "templates", saved.ID, "manifest.json")
	released := waitFor(20*time.Second+10*time.Second, func() bool {
		var m struct {
			Name string `json:"name"`
		}
		data, err := os.ReadFile(manifest)
		return err == nil && json.Unmarshal(data, &m) == nil && m.Name == ""
	})
	if !released {
		t.Fatalf("template %s is still kept as gold 10 s after its deadline", saved.ID)
	}
	if !slices.Contains(e.templateDirs(), saved.ID) {
		t.Fatalf("template %s went while gold-try-2 maps it", saved.ID)
	}
	e.ok("rm", "gold-try-2")
	if slices.Contains(e.templateDirs(), saved.ID) {
		t.Errorf("template %s still there after its last child went: %v", saved.ID, e.templateDirs())
	}
	if pids := e.qemuProcesses(); len(pids) != 1 || pids[0] != src.PID {
		t.Errorf("QEMU processes %v, want src's alone", pids)
	}
	if !waitFor(10*time.Second, func() bool { return len(e.reaperPIDs()) == 0 }) {
		t.Errorf("reaper still runs: %v", e.reaperPIDs())
	}
}
