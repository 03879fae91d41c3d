//go:build integration

package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBootExecListRemove walks the basic life of a machine on the real guest.
func TestBootExecListRemove(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	m := e.boot("g", "--port", "0:22")
	if m.Name != "g" || m.State != "running" || m.PID <= 0 {
		t.Fatalf("boot result = %+v, want g running with a pid", m)
	}

	if got := strings.TrimSpace(e.exec("g", "uname", "-r")); got != e.guest.KernelRelease {
		t.Errorf("uname -r in the guest = %q, want %q", got, e.guest.KernelRelease)
	}

	ms := e.list()
	if len(ms) != 1 {
		t.Fatalf("ls lists %d machines, want 1: %+v", len(ms), ms)
	}
	l := ms[0]
	if l.State != "running" || l.PID != m.PID || l.MemoryMiB != 256 || l.CPUs != 1 {
		t.Errorf("ls = %+v, want running, pid %d, 256 MiB, 1 cpu", l, m.PID)
	}
	for _, sock := range []string{l.QMP, l.QGA} {
		if st, err := os.Stat(sock); err != nil || st.Mode()&os.ModeSocket == 0 {
			t.Errorf("socket %q: %v, want a unix socket", sock, err)
		}
	}
	if len(l.Ports) != 1 || l.Ports[0].Guest != 22 || l.Ports[0].Host == 0 {
		t.Errorf("ports = %+v, want one forward to guest port 22 with a host port picked", l.Ports)
	}

	// Output, exit codes and stderr pass through; the disk at /data is real.
	r := e.vmfork("exec", "g", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	if r.code != 3 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("exec exit/out/err = %s, want exit 3, out\\n, err\\n", r)
	}
	e.exec("g", "sh", "-c", "echo persisted > /data/hello && sync")
	if got := e.exec("g", "cat", "/data/hello"); got != "persisted\n" {
		t.Errorf("/data/hello = %q, want persisted", got)
	}
	if r := e.ok("exec", "g", "--stdin", "--", "cat"); r.stdout != "" {
		t.Errorf("cat with empty stdin printed %q", r.stdout)
	}

	// A base image given with --disk is never written.
	before, err := os.ReadFile(e.guest.Disk)
	if err != nil {
		t.Fatal(err)
	}

	e.ok("rm", "g")
	if pids := e.qemuProcesses(); len(pids) != 0 {
		t.Errorf("QEMU processes left after rm: %v", pids)
	}
	if left, _ := filepath.Glob(filepath.Join(e.stateDir, "machines", "*")); len(left) != 0 {
		t.Errorf("machine files left after rm: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(e.memDir, "*")); len(left) != 0 {
		t.Errorf("RAM files left after rm: %v", left)
	}
	after, err := os.ReadFile(e.guest.Disk)
	if err != nil || string(after) != string(before) {
		t.Errorf("base image changed while the machine ran")
	}
	if ms := e.list(); len(ms) != 0 {
		t.Errorf("ls after rm = %+v, want none", ms)
	}
}

// TestStopKeepsDisk stops a machine: it shows as stopped, exec refuses it, and
// its disk overlay with what the guest wrote stays.
func TestStopKeepsDisk(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	m := e.boot("s")
	e.exec("s", "sh", "-c", "echo kept > /data/kept && sync")
	e.ok("stop", "s")
	if ownedQEMU(m.PID, e.stateDir) {
		t.Errorf("QEMU pid %d still runs after stop", m.PID)
	}
	ms := e.list()
	if len(ms) != 1 || ms[0].State != "stopped" || ms[0].PID != 0 {
		t.Fatalf("ls after stop = %+v, want s stopped without pid", ms)
	}
	if _, err := os.Stat(ms[0].Disk); err != nil {
		t.Errorf("disk overlay gone after stop: %v", err)
	}
	r := e.vmfork("exec", "s", "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "not running") {
		t.Errorf("exec on a stopped machine: %s, want an error saying it is not running", r)
	}
	e.ok("stop", "s") // idempotent
	e.ok("rm", "s")
}
