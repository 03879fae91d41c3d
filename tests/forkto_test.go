//go:build integration

package tests

import (
	"bytes"
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

type forkToJSON struct {
	Host      string  `json:"host"`
	Mode      string  `json:"mode"`
	LoadedMS  float64 `json:"loaded_ms"`
	Migration *struct {
		Status       string  `json:"status"`
		Bytes        int64   `json:"ram_bytes"`
		SwitchoverMS float64 `json:"switchover_ms"`
		TotalMS      float64 `json:"total_ms"`
	} `json:"migration"`
	Source    string        `json:"source"`
	PauseMS   float64       `json:"pause_ms"`
	Push      *transferJSON `json:"push"`
	Fork      *forkJSON     `json:"fork"`
	FreezeMS  float64       `json:"freeze_ms"`
	PushMS    float64       `json:"push_ms"`
	RemoteMS  float64       `json:"remote_fork_ms"`
	RunningMS float64       `json:"running_ms"`
	ReadyMS   float64       `json:"ready_ms"`
	Elapsed   float64       `json:"elapsed_ms"`
}

// forkTo returns the flags a fork --to from host a needs (hostRig.transfer).
func (r *hostRig) forkTo(child ...string) []string {
	return append(append([]string{}, child...), r.transfer()...)
}

// TestForkTo (issue 24 item 2): `fork SOURCE --to HOST` on the embedded
// driver, between the rig's two hosts (hosts_test.go):
//   - the link cut (the ssh client killed) in the middle of the push, as
//     the other host's fork begins, and at three points of the live path's
//     postcopy transfer (before the switchover, right after it, during
//     postcopy): nothing is left on host b (no machine, no kept template,
//     no QEMU), nothing but the source on host a (the loaded QEMU gone),
//     and the source runs;
//   - then a fork --to that completes on the live path (auto): the child
//     on host b continues the source's process (the counter's PID, a write
//     never synced to disk), READY with its own hostname, and the source
//     still runs; and one on the copy path (--to-mode copy).
func TestForkTo(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	r := newHostRig(t)
	a, b := r.hosts[0], r.hosts[1]
	a.boot("src")
	pid := strings.TrimSpace(a.exec("src", "vmfork-counter", "start"))

	nothingLeft := func(when string) {
		t.Helper()
		// The other host's fork-serve may still be finishing the fork it
		// will undo, its template serve the transfer it will give up: give
		// them until they end.
		deadline := time.Now().Add(90 * time.Second)
		for forkServes(b.stateDir) > 0 || len(b.list()) > 0 || len(b.qemuProcesses()) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: host b still has machines %v, QEMU %v", when, b.list(), b.qemuProcesses())
			}
			time.Sleep(time.Second)
		}
		// No template, staged file, machine or RAM file either (its chunk
		// store may keep what arrived: content a later push reuses). The
		// pushed template, given up (unnamed) by fork-serve, may have been
		// spared by that collection while another command on b (the
		// test's own ls, the reaper) was reading it: the next gc takes it,
		// as the reaper would. A template still kept under its fork-to
		// name is not collected and fails the check.
		b.ok("gc")
		b.storeIsEmpty(when)
		if r := a.vmfork("template", "ls", "--json"); strings.Contains(r.stdout, `"fork-to-`) {
			t.Errorf("%s: host a keeps a fork's template: %s", when, r.stdout)
		}
		if ms := a.list(); len(ms) != 1 || ms[0].Name != "src" || ms[0].State != "running" {
			t.Errorf("%s: host a has %+v, want src running alone", when, ms)
		}
		a.counterAdvances("src")
	}
	// The cut points. In the push (the disks', on the live path); the
	// moment the other host's fork-serve starts (before its QEMU: a
	// fork-serve killed by the hang-up there left its pushed template kept,
	// which the sending side now gives up); then the three of the postcopy
	// transfer, with the migration slowed so that each lands where it says:
	// before the switchover (b's QEMU listening, precopy held for 4 s),
	// right after it (the child's record there has its QEMU's PID: it
	// runs, its RAM mostly not there yet), and during postcopy (2 s later,
	// RAM still streaming at 2 MiB/s).
	slow := []string{"--postcopy-bandwidth", "2097152"}
	childRuns := func() bool {
		data, _ := os.ReadFile(filepath.Join(b.stateDir, "machines", "kid", "machine.json"))
		return bytes.Contains(data, []byte(`"pid":`))
	}
	for _, cut := range []struct {
		what, when string
		now        func() bool
		flags      []string
		// migration is where host a's loaded QEMU's migration ended, as
		// the error reports it: the proof that the cut landed there.
		migration string
	}{
		{"template serve", "in the push", func() bool { return true }, nil, ""},
		{"fork-serve", "as the fork there begins", func() bool { return true }, nil, ""},
		{"fork-serve", "before the switchover", func() bool { return len(b.qemuProcesses()) > 0 },
			append([]string{"--postcopy-after", "4s"}, slow...), "(migration failed)"},
		{"fork-serve", "right after the switchover", childRuns, slow, "(migration postcopy-paused)"},
		{"fork-serve", "during postcopy", func() bool {
			if !childRuns() {
				return false
			}
			time.Sleep(2 * time.Second)
			return true
		}, slow, "(migration postcopy-paused)"},
	} {
		args := append(append([]string{"fork", "src", "kid", "--to", b.addr, "--to-mode", "postcopy"}, cut.flags...), r.forkTo()...)
		res := a.cutSSH(t, cut.what, cut.now, args...)
		if res.code == 0 {
			t.Errorf("fork --to with the link cut %s: %s, want a failure", cut.when, res)
		} else {
			lines := strings.Split(strings.TrimSpace(res.stderr), "\n")
			t.Logf("link cut %s: exit %d: %s", cut.when, res.code, lines[len(lines)-1])
			if !strings.Contains(res.stderr, cut.migration) {
				t.Errorf("link cut %s: the error does not say %q: %s", cut.when, cut.migration, lines[len(lines)-1])
			}
		}
		nothingLeft("the link cut " + cut.when)
		if qs := a.qemuProcesses(); len(qs) != 1 {
			t.Errorf("the link cut %s: host a runs QEMUs %v, want the source's alone (the loaded one killed)", cut.when, qs)
		}
	}

	// vmfork itself killed during postcopy: the QEMU it loaded here goes
	// with it (never left paused behind it), the other host undoes its
	// child as for a cut link, the source runs, and gc gives the fork's
	// template here up (nothingLeft fails on a fork-to- template).
	args := append(append([]string{"fork", "src", "kid", "--to", b.addr, "--to-mode", "postcopy"}, slow...), r.forkTo()...)
	loaded := func(marker string) (pids []int) {
		ents, _ := os.ReadDir("/proc")
		for _, ent := range ents {
			p, err := strconv.Atoi(ent.Name())
			if err == nil && proc.Alive(p, marker) {
				pids = append(pids, p)
			}
		}
		return pids
	}
	sawLoaded := false
	killed, cli := a.cutAt(t, "fork-serve", func() bool {
		if !childRuns() {
			return false
		}
		time.Sleep(time.Second)
		sawLoaded = len(loaded("vmfork-loaded-")) > 0
		return true
	}, true, args...)
	if killed.code == 0 {
		t.Errorf("fork --to with vmfork killed during postcopy: %s, want a failure", killed)
	}
	if !sawLoaded {
		t.Errorf("vmfork killed during postcopy: no loaded QEMU was running when it was killed")
	}
	loadedBy := func() []int { return loaded(fmt.Sprintf("vmfork-loaded-%d-", cli)) }
	for deadline := time.Now().Add(10 * time.Second); len(loadedBy()) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("vmfork killed: its loaded QEMU %v still runs", loadedBy())
			for _, p := range loadedBy() {
				syscall.Kill(p, syscall.SIGKILL)
			}
			break
		}
	}
	// gc gives the fork's template here up at once: its vmfork is gone
	// (forkToAbandoned), no hour to wait.
	a.ok("gc")
	nothingLeft("vmfork killed during postcopy")

	// Never synced: it lives in the guest's page cache, i.e. in its RAM.
	a.exec("src", "sh", "-c", "echo unsynced > /data/unsynced")
	before := a.counter("src")
	var res forkToJSON
	a.jsonOK(&res, append([]string{"fork", "src", "--to", b.addr, "kid", "--hostname", "kid-on-b"}, r.transfer()...)...)
	t.Logf("fork --to (%s): source paused %.1f ms; freeze %.0f ms, push done %.0f ms (%.1f MiB, %d of %d chunks), child running %.0f ms, ready %.0f ms, all %.0f ms; migration %+v",
		res.Mode, res.PauseMS, res.FreezeMS, res.PushMS, mib(res.Push.BytesOut), res.Push.Received.ChunksSent, res.Push.Received.Chunks, res.RunningMS, res.ReadyMS, res.Elapsed, res.Migration)
	// That live fork swept what the killed vmfork left here: its loaded
	// QEMU's directory and ssh's forwarded socket.
	if left, _ := filepath.Glob(fmt.Sprintf("/tmp/vmfork-*-%d-*", cli)); len(left) > 0 {
		t.Errorf("after a later live fork, the killed vmfork's leftovers remain: %v", left)
	}
	if res.Mode != "postcopy" || res.Migration == nil || res.Migration.Status != "completed" {
		t.Errorf("fork --to of one child took mode %q (migration %+v), want the live path, completed", res.Mode, res.Migration)
	}
	if res.Fork == nil || len(res.Fork.Children) != 1 || res.Fork.Children[0].Name != "kid" {
		t.Fatalf("fork --to = %+v, want child kid", res)
	}
	if got := strings.TrimSpace(b.exec("kid", "cat", "/run/counter.pid")); got != pid {
		t.Errorf("kid on host b: counter PID %s, want the source's %s", got, pid)
	}
	if n := b.counter("kid"); n < before {
		t.Errorf("kid on host b: counter %d, want it to go on from %d", n, before)
	}
	if got := b.exec("kid", "cat", "/data/unsynced"); got != "unsynced\n" {
		t.Errorf("kid on host b: the unsynced write reads %q", got)
	}
	if got := strings.TrimSpace(b.exec("kid", "hostname")); got != "kid-on-b" {
		t.Errorf("kid on host b: hostname %q, want its own, kid-on-b", got)
	}
	if ms := b.list(); len(ms) != 1 || ms[0].Name != "kid" || ms[0].State != "running" {
		t.Errorf("host b has %+v, want kid running", ms)
	}
	if got := strings.TrimSpace(a.exec("src", "hostname")); got == "kid-on-b" {
		t.Errorf("the source took the child's hostname")
	}
	a.counterAdvances("src")
	b.ok("rm", "kid", "--force")

	// The source's pause against a local fork's (the bound is
	// 1.2x; logged, not asserted: single pauses move by more than that on
	// this shared TCG host).
	var local forkJSON
	a.jsonOK(&local, "fork", "src", "local-kid")
	t.Logf("source's pause: fork --to %.1f ms, local fork %.1f ms (ratio %.2f)", res.PauseMS, local.PauseMS, res.PauseMS/local.PauseMS)
	a.ok("rm", "local-kid", "--force")

	// The copy path, still the fallback: the whole template pushed, then
	// forked there.
	var cp forkToJSON
	a.jsonOK(&cp, append([]string{"fork", "src", "--to", b.addr, "kid3", "--to-mode", "copy"}, r.transfer()...)...)
	t.Logf("fork --to (copy): source paused %.1f ms; push done %.0f ms (%.1f MiB), child running %.0f ms, ready %.0f ms",
		cp.PauseMS, cp.PushMS, mib(cp.Push.BytesOut), cp.RunningMS, cp.ReadyMS)
	if cp.Mode != "copy" || cp.Fork == nil || len(cp.Fork.Children) != 1 {
		t.Errorf("fork --to --to-mode copy = %+v", cp)
	}
	b.ok("rm", "kid3", "--force")

	// The same by hand, for docs/TEMPLATES.md: save here, push, fork there.
	// Not asserted: both paths do the same work today.
	t0 := time.Now()
	a.ok("template", "save", "src", "by-hand")
	saved := time.Since(t0)
	var p transferJSON
	a.jsonOK(&p, append([]string{"template", "push", "by-hand", b.addr}, r.transfer()...)...)
	pushed := time.Since(t0)
	var f forkJSON
	b.jsonOK(&f, "fork", "by-hand", "kid2", "--hostname", "kid2-on-b")
	if len(f.Children) == 1 {
		t.Logf("save + push + fork on b: save %.0f ms, push done %.0f ms (%.1f MiB, %d of %d chunks), child running %.0f ms, ready %.0f ms",
			ms(saved), ms(pushed), mib(p.BytesOut), p.Received.ChunksSent, p.Received.Chunks, ms(pushed)+f.Children[0].RunningMS, ms(pushed)+f.Children[0].ReadyMS)
	}
	b.ok("rm", "kid2", "--force")
}

// cutSSH runs vmfork args on e and, once it runs an ssh whose command line
// holds what and now() says so, kills that ssh (the link dies, as far as both ends can tell);
// it returns how vmfork ended.
func (e *env) cutSSH(t *testing.T, what string, now func() bool, args ...string) result {
	t.Helper()
	r, _ := e.cutAt(t, what, now, false, args...)
	return r
}

// cutAt is cutSSH, killing vmfork itself instead of its ssh when killCLI
// is set; it also returns vmfork's pid.
func (e *env) cutAt(t *testing.T, what string, now func() bool, killCLI bool, args ...string) (result, int) {
	t.Helper()
	argv := append(slices.Clone(e.runAs), append([]string{e.bin, "--state-dir", e.stateDir, "--mem-dir", e.memDir}, args...)...)
	cmd := exec.Command(argv[0], argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	killed := false
	deadline := time.Now().Add(5 * time.Minute)
	for !killed {
		select {
		case <-done:
			t.Fatalf("vmfork %v ended before an ssh running %q was seen: %s", args, what, errb.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("vmfork %v: no ssh running %q", args, what)
		}
		for _, p := range childPIDs(cmd.Process.Pid) {
			cl, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "cmdline"))
			if strings.HasPrefix(string(cl), "ssh\x00") && strings.Contains(string(cl), what) && now() {
				// Let some of it happen first.
				time.Sleep(300 * time.Millisecond)
				if killCLI {
					p = cmd.Process.Pid
				}
				syscall.Kill(p, syscall.SIGKILL)
				killed = true
			}
		}
	}
	err := <-done
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	}
	return r, cmd.Process.Pid
}

// childPIDs lists the processes whose parent is pid.
func childPIDs(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, ent := range ents {
		p, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		st, _ := os.ReadFile(filepath.Join("/proc", ent.Name(), "stat"))
		// pid (comm) state ppid ...
		if i := bytes.LastIndexByte(st, ')'); i > 0 {
			f := strings.Fields(string(st[i+1:]))
			if len(f) > 1 && f[1] == strconv.Itoa(pid) {
				out = append(out, p)
			}
		}
	}
	return out
}

// forkServes counts the fork-serve and template serve processes running
// for state dir dir
// (the rig's sshd gives them their dirs in their environment).
func forkServes(dir string) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, ent := range ents {
		if _, err := strconv.Atoi(ent.Name()); err != nil {
			continue
		}
		cl, _ := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if !bytes.Contains(cl, []byte("\x00fork-serve\x00")) && !bytes.Contains(cl, []byte("\x00template\x00serve\x00")) {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", ent.Name(), "environ"))
		if bytes.Contains(env, []byte("VMFORK_STATE_DIR="+dir+"\x00")) {
			n++
		}
	}
	return n
}
