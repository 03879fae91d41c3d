//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qmp"
)

// The crash matrix (docs/RELIABILITY.md): vmfork is killed with SIGKILL at
// each named point of the fork pipeline, of template save, of pool refill
// and of rm (VMFORK_FAULT, fault_failpoints.go), or a QEMU is killed there,
// and the next command must repair what it finds. The command under the
// fault is the failpoints build (failpointsBin); the repair and every other
// command are the product's. Each case runs crashRuns() times on one source
// machine that all cases share.

// crashRuns is how often each case runs: once in make test (every fault
// point, with vmfork and with a QEMU killed where a case does that, one
// kill each: one run proves its repair; the cases that only reach a point
// another verb reached first are left to make crash-matrix),
// VMFORK_CRASH_RUNS (make crash-matrix: 10, every case) to hunt the rarer
// timings.
func crashRuns(t *testing.T) int {
	if s := os.Getenv("VMFORK_CRASH_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("VMFORK_CRASH_RUNS=%q: want a count of at least 1", s)
		}
		return n
	}
	return 1
}

// crashCase is one row of the matrix.
type crashCase struct {
	name  string
	fault string // VMFORK_FAULT (faultEnv)
	// prep sets up what the command needs and returns its arguments.
	prep func(r *rig, i int) []string
	// after checks what is particular to the case once the repair ran;
	// r.check has checked the invariants already.
	after func(r *rig, i int)
	// victim: the command's source is a machine booted for this run alone
	// (its QEMU is killed), not the shared source.
	victim bool
	// victimBoot, when set, gives the victim's boot its extra flags (a
	// block disk: crash_blockdisk_test.go).
	victimBoot func(r *rig) []string
	// done, when set, runs once the case's runs are over (it removes what
	// the case made for all of them, such as a loop device).
	done func()
	// matrixOnly: make crash-matrix runs the case, make test's slice does
	// not (a case whose every run boots a victim for a path the slice's
	// cheaper cases cover in part).
	matrixOnly bool
}

// self reports whether the fault kills vmfork itself (the default action).
func (c crashCase) self() bool { return !strings.HasSuffix(c.fault, ":qemu") }

func TestCrashMatrix(t *testing.T) {
	parallel(t) // heavy and self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	r := &rig{env: e, t: t, faultBin: failpointsBin(t)}
	t.Cleanup(r.killStrays)
	e.boot("src")
	e.exec("src", "vmfork-counter", "start")
	runs := crashRuns(t)
	fork := func(n int) func(*rig, int) []string {
		return func(*rig, int) []string { return []string{"fork", "src", "--count", strconv.Itoa(n)} }
	}
	save := func(extra ...string) func(*rig, int) []string {
		return func(_ *rig, i int) []string {
			return append([]string{"template", "save", "src", fmt.Sprintf("k%d", i)}, extra...)
		}
	}
	forkDelta := func(r *rig, i int) []string {
		r.ok("fork", "src", fmt.Sprintf("held%d", i))
		return []string{"fork", "src", "--count", "1"}
	}
	keptOK := func(r *rig, i int) {
		// A save killed after its freeze keeps a whole template, or none.
		for _, tp := range r.templates() {
			if tp.Name == fmt.Sprintf("k%d", i) {
				r.ok("template", "rm", tp.Name)
			}
		}
	}
	cases := []crashCase{
		{name: "fork-reserved", fault: vmfork.FaultForkReserved, prep: fork(2)},
		{name: "fork-paused", fault: vmfork.FaultFreezePaused, prep: fork(1), after: func(r *rig, _ int) { r.forkOK() }},
		{name: "fork-frozen", fault: vmfork.FaultForkFrozen, prep: fork(2)},
		{name: "fork-spawned", fault: vmfork.FaultQEMUSpawned, prep: fork(2)},
		{name: "fork-running", fault: vmfork.FaultForkRunning, prep: fork(2)},
		{name: "fork-identity", fault: vmfork.FaultForkIdentity, prep: fork(2)},
		// fork --disk-only killed with the guest's filesystems frozen: the
		// repair thaws them (a write and sync in the source finish).
		{name: "diskonly-frozen", fault: vmfork.FaultDiskOnlyFrozen,
			prep: func(*rig, int) []string { return []string{"fork", "src", "--disk-only", "--count", "2"} },
			after: func(r *rig, _ int) {
				if res := r.vmfork("--timeout", "30s", "exec", "src", "--", "sh", "-c", "echo thawed >/data/thawed && sync"); res.code != 0 {
					r.t.Errorf("after a kill at %s: a write in the source: %s; want its filesystems thawed", vmfork.FaultDiskOnlyFrozen, res)
				}
			}},
		// A fork while an earlier child keeps the source's frozen file:
		// a delta template (docs/DELTAS.md), killed in its pause and
		// after its freeze.
		{name: "fork-paused-delta", fault: vmfork.FaultFreezePaused, prep: forkDelta},
		{name: "fork-frozen-delta", fault: vmfork.FaultForkFrozen, prep: forkDelta},
		{name: "fork-running-kill-child", fault: vmfork.FaultForkRunning + ":qemu", prep: fork(1)},
		{name: "fork-paused-kill-source", fault: vmfork.FaultFreezePaused + ":qemu", victim: true,
			prep: func(*rig, int) []string { return []string{"fork", "victim", "--count", "1"} }},
		{name: "boot-spawned", fault: vmfork.FaultQEMUSpawned, prep: func(r *rig, i int) []string {
			return []string{"boot", fmt.Sprintf("b%d", i), "--kernel", r.guest.Kernel, "--initrd", r.guest.Initrd, "--memory", "256M"}
		}},
		{name: "save-reserved", fault: vmfork.FaultSaveReserved, prep: save(), after: keptOK},
		{name: "save-paused", fault: vmfork.FaultFreezePaused, prep: save(), after: keptOK},
		{name: "save-frozen", fault: vmfork.FaultSaveFrozen, prep: save("--pool", "1"), after: func(r *rig, i int) {
			// Frozen before the kill: the template is whole and kept.
			if tp, ok := r.findTemplate(fmt.Sprintf("k%d", i)); !ok || !tp.HasMemory {
				r.t.Errorf("after a kill at %s: template k%d = %+v (found %v), want it kept with memory", vmfork.FaultSaveFrozen, i, tp, ok)
			}
			keptOK(r, i)
		}},
		{name: "pool-spawned", fault: vmfork.FaultQEMUSpawned, prep: r.pool(2)},
		{name: "pool-filled", fault: vmfork.FaultPoolFilled, prep: r.pool(2)},
		{name: "pool-taken", fault: vmfork.FaultPoolTaken, prep: r.forkKept},
		{name: "pool-taken-kill-member", fault: vmfork.FaultPoolTaken + ":qemu", prep: r.forkKept},
		{name: "rm-stopped", fault: vmfork.FaultRmStopped, prep: r.rmChild, after: r.childGone},
		{name: "rm-removing", fault: vmfork.FaultRmRemoving, prep: r.rmChild, after: r.childGone},
		// crash_hibernate_test.go
		{name: "hibernate-frozen", fault: vmfork.FaultHibernateFrozen, victim: true, prep: r.hibernateVictim, after: victimIs("running")},
		{name: "hibernate-committed", fault: vmfork.FaultHibernateCommitted, victim: true, prep: r.hibernateVictim, after: victimIs("hibernated")},
		{name: "resume-running", fault: vmfork.FaultResumeRunning, victim: true, prep: r.resumeVictim, after: victimIs("hibernated")},
		{name: "rewind-running", fault: vmfork.FaultRewindRunning, victim: true, prep: r.rewindVictim, after: victimIs("stopped")},
		{name: "start-running", fault: vmfork.FaultStartRunning, prep: r.startChild, after: childStillStopped},
		{name: "start-spawned", fault: vmfork.FaultQEMUSpawned, prep: r.startChild, after: childStillStopped},
	}
	cases = append(cases, blockDiskCases()...) // crash_blockdisk_test.go
	cases = append(cases, xdiskCases()...)     // crash_xdisk_test.go
	// VMFORK_CRASH_CASES (a regexp on case names) runs some cases only.
	// make test runs the CI slice: the first case of each fault (a point,
	// with vmfork or a QEMU killed there); make crash-matrix (more runs)
	// or a VMFORK_CRASH_CASES runs every case it names.
	only := regexp.MustCompile(os.Getenv("VMFORK_CRASH_CASES"))
	slice := runs == 1 && os.Getenv("VMFORK_CRASH_CASES") == ""
	points, ran := map[string]bool{}, map[string]string{}
	for _, c := range cases {
		points[strings.TrimSuffix(c.fault, ":qemu")] = true
		if !only.MatchString(c.name) {
			continue
		}
		if first, dup := ran[c.fault]; dup && slice {
			t.Logf("case %s: not in make test's slice (%s ran at %s); make crash-matrix runs it", c.name, first, c.fault)
			continue
		}
		if c.matrixOnly && slice {
			t.Logf("case %s: not in make test's slice; make crash-matrix runs it", c.name)
			continue
		}
		ran[c.fault] = c.name
		start := time.Now()
		for i := 1; i <= runs; i++ {
			r.run(c, i)
			if t.Failed() {
				t.Fatalf("case %s run %d failed; stopping the matrix", c.name, i)
			}
		}
		if c.done != nil {
			c.done()
		}
		// The source forks as before once the case's debris is repaired.
		r.forkOK()
		t.Logf("case %s: %d runs repaired (%v)", c.name, runs, time.Since(start).Round(time.Second))
	}
	for _, p := range vmfork.FaultPoints {
		if !points[p] {
			t.Errorf("fault point %s has no case in the matrix", p)
		}
	}
}

// rig runs the matrix in one env.
type rig struct {
	*env
	t        *testing.T
	faultBin string // the failpoints build, for the command under the fault
	counter  int    // the source's guest counter before the last run
}

func (r *rig) run(c crashCase, i int) {
	r.t.Helper()
	src := "src"
	if c.victim {
		src = "victim"
		var extra []string
		if c.victimBoot != nil {
			extra = c.victimBoot(r)
		}
		r.boot("victim", extra...)
	}
	args := c.prep(r, i)
	sums := r.templateSums()
	r.counter = r.counterOf("src")
	res, killed := r.faulted(c.fault, args...)
	label := fmt.Sprintf("%s run %d (%s)", c.name, i, strings.Join(args, " "))
	if c.self() && !killed {
		r.t.Fatalf("%s: vmfork was not killed at %s: %s", label, c.fault, res)
	}
	if !c.self() && killed {
		r.t.Fatalf("%s: vmfork died at %s, want it to carry on: %s", label, c.fault, res)
	}
	if strings.HasPrefix(c.fault, vmfork.FaultFreezePaused) && c.self() {
		r.plantFreezeTemp()
	}
	r.check(label, src, sums, c.victim)
	if c.after != nil {
		c.after(r, i)
	}
	r.clearChildren()
	if c.victim {
		r.ok("rm", "victim")
	}
}

// faulted runs the failpoints build with VMFORK_FAULT set and reports
// whether SIGKILL ended it.
func (r *rig) faulted(fault string, args ...string) (result, bool) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.faultBin, append([]string{"--state-dir", r.stateDir, "--mem-dir", r.memDir}, args...)...)
	cmd.Env = append(os.Environ(), faultEnv+"="+fault)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	res := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		res.code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return res, ctx.Err() == nil
		}
	} else if err != nil {
		r.t.Fatalf("run vmfork %v: %v", args, err)
	}
	return res, false
}

// plantFreezeTemp leaves what a kill inside the RAM copy leaves (the copy
// is sharedmem's and has no fault point of its own): the temporary file of
// the template the killed command reserved. Before the repair it made every
// later fork of the source fail with "file exists".
func (r *rig) plantFreezeTemp() {
	r.t.Helper()
	entries, _ := filepath.Glob(filepath.Join(r.stateDir, "journal", "*.json"))
	for _, f := range entries {
		var e struct {
			Op       string `json:"op"`
			Template string `json:"template"`
		}
		if data, err := os.ReadFile(f); err == nil && json.Unmarshal(data, &e) == nil && e.Template != "" {
			tmp := filepath.Join(r.memDir, "."+e.Template+".ram.tmp")
			if err := os.WriteFile(tmp, []byte("half a RAM copy"), 0o600); err != nil {
				r.t.Fatal(err)
			}
			return
		}
	}
	r.t.Fatalf("no journal entry with a template after a kill during the freeze")
}

// check runs `vmfork ls` (which repairs) and checks the invariants of the
// matrix.
func (r *rig) check(label, src string, sums map[string]string, victim bool) {
	r.t.Helper()
	ms := r.list()
	byName := map[string]machineJSON{}
	for _, m := range ms {
		byName[m.Name] = m
		if m.State == "creating" {
			r.t.Errorf("%s: after the repair %s is still creating", label, m.Name)
		}
	}
	// 0 paused sources, and the shared source's guest ran on throughout.
	if s, ok := byName["src"]; !ok || s.State != "running" {
		r.t.Fatalf("%s: source src = %+v, want running", label, s)
	}
	if st := r.qmpStatus(byName["src"].QMP); st != "running" {
		r.t.Errorf("%s: source src QEMU status %q, want running", label, st)
	}
	// The counter ticks every 0.2 s; a source the repair has just resumed
	// needs a moment.
	got := r.counterOf("src")
	for deadline := time.Now().Add(10 * time.Second); got <= r.counter && time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		got = r.counterOf("src")
	}
	if got <= r.counter {
		r.t.Errorf("%s: source counter %d, want more than %d before the kill", label, got, r.counter)
	}
	if victim {
		if v, ok := byName[src]; ok && v.State == "running" && r.qmpStatus(v.QMP) != "running" {
			r.t.Errorf("%s: %s is listed running but its QEMU is not", label, src)
		}
	}
	// 0 half-made children listed as running: a running child has its
	// own hostname (the identity chain finished).
	for _, m := range ms {
		if m.Parent == "" || m.State != "running" {
			continue
		}
		if h := strings.TrimSpace(r.exec(m.Name, "hostname")); h != m.Name {
			r.t.Errorf("%s: child %s runs with hostname %q, want its own name", label, m.Name, h)
		}
	}
	r.checkProcesses(label, ms)
	r.checkDisks(label)
	for path, want := range sums {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			continue // freed (a template's RAM once no child maps it)
		}
		if got := fileSHA256(r.t, path); got != want {
			r.t.Errorf("%s: template file %s changed: sha256 %s, want %s", label, path, got, want)
		}
	}
	for _, tp := range r.templates() {
		if tp.Name != "" && !tp.HasMemory {
			r.t.Errorf("%s: kept template %s has no memory: a save that did not finish", label, tp.Name)
		}
	}
	r.checkLeftovers(label)
}

// checkProcesses compares the QEMU processes under the state dir with the
// records: every process is recorded, every running record has its process.
func (r *rig) checkProcesses(label string, ms []machineJSON) {
	r.t.Helper()
	recorded := map[int]string{}
	for _, m := range ms {
		if m.State != "stopped" && m.PID > 0 {
			recorded[m.PID] = m.Name
			if !ownedQEMU(m.PID, r.stateDir) {
				r.t.Errorf("%s: %s is %s with pid %d, but no such QEMU runs", label, m.Name, m.State, m.PID)
			}
		}
	}
	for _, mb := range r.members() {
		if mb.State == "creating" {
			r.t.Errorf("%s: pool member %s is still creating after the repair", label, mb.Name)
		}
		if mb.PID > 0 && ownedQEMU(mb.PID, r.stateDir) {
			recorded[mb.PID] = mb.Name
		}
	}
	for _, pid := range r.qemuProcesses() {
		if _, ok := recorded[pid]; !ok {
			cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			r.t.Errorf("%s: QEMU pid %d runs with no record: %s", label, pid, strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
}

// checkDisks runs qemu-img check on every qcow2 image in the state dir.
// -U: the images of running machines are locked by their QEMU.
func (r *rig) checkDisks(label string) {
	r.t.Helper()
	filepath.WalkDir(r.stateDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".qcow2") {
			return nil
		}
		out, err := exec.Command("qemu-img", "check", "-U", path).CombinedOutput()
		if err != nil {
			r.t.Errorf("%s: qemu-img check %s: %v\n%s", label, path, err, out)
		}
		return nil
	})
}

// checkLeftovers: no journal entry, no trash, no temporary RAM file and no
// RAM file that no machine or template owns.
func (r *rig) checkLeftovers(label string) {
	r.t.Helper()
	left, _ := filepath.Glob(filepath.Join(r.stateDir, "journal", "*"))
	trash, _ := filepath.Glob(filepath.Join(r.stateDir, "machines", ".rm.*"))
	tmps, _ := filepath.Glob(filepath.Join(r.memDir, ".*"))
	for _, f := range append(append(left, trash...), tmps...) {
		r.t.Errorf("%s: left behind: %s", label, f)
	}
	rams, _ := filepath.Glob(filepath.Join(r.memDir, "*.ram"))
	for _, f := range rams {
		owner := strings.TrimSuffix(filepath.Base(f), ".ram")
		if strings.HasSuffix(owner, ".base") {
			continue // a delta template's base: below
		}
		if _, err := os.Stat(filepath.Join(r.stateDir, "machines", owner)); err == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(r.stateDir, "templates", owner)); err == nil {
			continue
		}
		r.t.Errorf("%s: RAM file %s has no machine or template", label, f)
	}
	// A delta's files (docs/DELTAS.md, "Delta templates") belong to a
	// template that holds memory: a freeze killed before its record said
	// so leaves none (the base's name would hold a whole RAM file).
	withMemory := map[string]bool{}
	for _, tp := range r.templates() {
		withMemory[tp.ID] = tp.HasMemory
	}
	bases, _ := filepath.Glob(filepath.Join(r.memDir, "*.base.ram"))
	deltas, _ := filepath.Glob(filepath.Join(r.memDir, "*.delta"))
	for _, f := range append(bases, deltas...) {
		owner := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(f), ".base.ram"), ".delta")
		if !withMemory[owner] {
			r.t.Errorf("%s: delta file %s has no template with memory", label, f)
		}
	}
}

// templateSums returns the sha256 of every file of every template that
// holds memory: none may change while the template exists.
func (r *rig) templateSums() map[string]string {
	r.t.Helper()
	sums := map[string]string{}
	for _, tp := range r.templates() {
		if !tp.HasMemory {
			continue
		}
		files := []string{
			filepath.Join(r.memDir, tp.ID+".ram"),
			filepath.Join(r.memDir, tp.ID+".base.ram"),
			filepath.Join(r.memDir, tp.ID+".delta"),
			filepath.Join(r.stateDir, "templates", tp.ID, "devstate"),
			filepath.Join(r.stateDir, "templates", tp.ID, "disk.qcow2"),
		}
		// Extra disks frozen into the template (disk-<id>.qcow2).
		xdisks, _ := filepath.Glob(filepath.Join(r.stateDir, "templates", tp.ID, "disk-*.qcow2"))
		files = append(files, xdisks...)
		for _, f := range files {
			if _, err := os.Stat(f); err == nil {
				sums[f] = fileSHA256(r.t, f)
			}
		}
	}
	return sums
}

func (r *rig) templates() []templateJSON {
	r.t.Helper()
	var ts []templateJSON
	r.jsonOK(&ts, "template", "ls")
	return ts
}

func (r *rig) findTemplate(name string) (templateJSON, bool) {
	for _, tp := range r.templates() {
		if tp.Name == name {
			return tp, true
		}
	}
	return templateJSON{}, false
}

type memberJSON struct {
	Name  string `json:"name"`
	State string `json:"state"`
	PID   int    `json:"pid"`
}

func (r *rig) members() []memberJSON {
	r.t.Helper()
	files, _ := filepath.Glob(filepath.Join(r.stateDir, "pool", "*", "*", "member.json"))
	var out []memberJSON
	for _, f := range files {
		var m memberJSON
		data, err := os.ReadFile(f)
		if err != nil || json.Unmarshal(data, &m) != nil {
			r.t.Errorf("pool member record %s unreadable: %v", f, err)
			continue
		}
		out = append(out, m)
	}
	return out
}

func (r *rig) qmpStatus(sock string) string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), 30*time.Second)
	defer cancel()
	mon, err := qmp.Dial(ctx, sock)
	if err != nil {
		return "unreachable: " + err.Error()
	}
	defer mon.Close()
	st, err := mon.QueryStatus(ctx)
	if err != nil {
		return "unknown: " + err.Error()
	}
	return st.Status
}

func (r *rig) counterOf(name string) int {
	r.t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(r.exec(name, "cat", "/run/counter")))
	if err != nil {
		r.t.Fatalf("counter of %s: %v", name, err)
	}
	return n
}

// forkOK forks the source cleanly: the fork after a repaired crash works
// (a stale file of the killed fork would make it fail), and its child is
// whole.
func (r *rig) forkOK() {
	r.t.Helper()
	var res forkJSON
	r.jsonOK(&res, "fork", "src", "--count", "1")
	if len(res.Children) != 1 {
		r.t.Fatalf("fork after the repair: %+v, want one child", res)
	}
	name := res.Children[0].Name
	if h := strings.TrimSpace(r.exec(name, "hostname")); h != name {
		r.t.Errorf("fork after the repair: child %s has hostname %q", name, h)
	}
	r.ok("rm", name)
}

// clearChildren removes every machine but the shared source and a victim.
func (r *rig) clearChildren() {
	r.t.Helper()
	for _, m := range r.list() {
		if m.Name != "src" && m.Name != "victim" {
			r.ok("rm", m.Name)
		}
	}
}

// ensureKept makes the kept template the pool cases use, with pool size n.
func (r *rig) ensureKept(n int) {
	r.t.Helper()
	if _, ok := r.findTemplate("keep"); !ok {
		r.ok("template", "save", "src", "keep")
	}
	r.ok("template", "pool", "keep", strconv.Itoa(n))
}

// pool returns a prep that empties the kept template's pool and refills it
// to n under the fault.
func (r *rig) pool(n int) func(*rig, int) []string {
	return func(r *rig, _ int) []string {
		r.ensureKept(0)
		return []string{"template", "pool", "keep", strconv.Itoa(n)}
	}
}

// forkKept gives the kept template one pool member and forks it.
func (r *rig) forkKept(_ *rig, _ int) []string {
	r.ensureKept(1)
	return []string{"fork", "keep", "--count", "1", "--prefix", "kid"}
}

// rmChild forks a child cleanly and removes it under the fault.
func (r *rig) rmChild(_ *rig, _ int) []string {
	r.t.Helper()
	var res forkJSON
	r.jsonOK(&res, "fork", "src", "--count", "1", "--prefix", "gone")
	return []string{"rm", res.Children[0].Name}
}

// childGone: a killed rm is finished by the next command.
func (r *rig) childGone(_ *rig, _ int) {
	for _, m := range r.list() {
		if strings.HasPrefix(m.Name, "gone-") {
			r.t.Errorf("after a killed rm: %s is still listed (%s)", m.Name, m.State)
		}
	}
	if d, _ := filepath.Glob(filepath.Join(r.stateDir, "machines", "*gone-*")); len(d) > 0 {
		r.t.Errorf("after a killed rm: files left: %v", d)
	}
}

// killStrays kills, by PID, every QEMU still running under the test's state
// dir when the test ends, recorded or not (env.cleanup only knows the
// recorded ones).
func (r *rig) killStrays() {
	for _, pid := range r.qemuProcesses() {
		syscall.Kill(pid, syscall.SIGKILL)
		waitExit(pid, r.stateDir, 10*time.Second)
	}
}

// TestBootNeverAnswers: a guest that never answers (a kernel without its
// initrd panics and reboots in a loop) fails the boot after the bound, with
// an error that names the wait and shows the serial console, and leaves
// nothing behind.
func TestBootNeverAnswers(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	start := time.Now()
	// panic=0: the kernel stops at its panic, so the console's last lines
	// are the panic's (with the default panic=-1 it reboots in a loop, and
	// the wait is bounded the same way).
	res := e.vmfork("-q", "--timeout", "45s", "boot", "lost", "--kernel", e.guest.Kernel, "--memory", "256M",
		"--append", "console=ttyS0 quiet panic=0")
	elapsed := time.Since(start)
	if res.code != 1 {
		t.Fatalf("boot without initrd: %s, want exit 1", res)
	}
	msg := strings.TrimSpace(res.stderr)
	t.Logf("boot failed after %v: %s", elapsed.Round(time.Second), msg)
	if strings.Count(msg, "\n") != 0 {
		t.Errorf("error is not one line: %q", msg)
	}
	for _, want := range []string{`guest agent of "lost" did not answer within`, "last serial console lines:", "Kernel panic"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
	if elapsed > 3*time.Minute {
		t.Errorf("boot failed after %v, want about the 45s bound", elapsed)
	}
	if ms := e.list(); len(ms) != 0 {
		t.Errorf("after the failed boot: machines %+v, want none", ms)
	}
	if pids := e.qemuProcesses(); len(pids) != 0 {
		t.Errorf("after the failed boot: QEMU processes %v left", pids)
	}
}
