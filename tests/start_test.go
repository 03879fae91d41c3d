//go:build integration

package tests

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startJSON is one machine of vmfork start --json.
type startJSON struct {
	Name     string   `json:"name"`
	State    string   `json:"state"`
	PID      int      `json:"pid"`
	MAC      string   `json:"mac"`
	Hostname string   `json:"hostname"`
	Restored []string `json:"restored"`
}

// TestHostRestart simulates a host restart (every QEMU of the state dir
// killed, the mem dir emptied) and checks that every command finds the
// truth without a repair by hand: ls says why each machine is stopped, the
// kept template whose RAM went is marked and refused in one line, the
// child that ran from it starts again from its own disk as the same
// machine (and is forkable), the hibernated machine resumes, and gc gives
// up the template. Stop and start without a restart are in the conformance
// suite (both drivers).
func TestHostRestart(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("src")
	e.ok("template", "save", "src", "gold")
	e.ok("fork", "gold", "kid")
	before := e.machine("kid")
	kidID := e.exec("kid", "sh", "-c", guestIdentity+"; echo kept >/data/restart-mark && sync")
	e.ok("hibernate", "src")

	// The restart.
	pids := e.qemuProcesses()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, pid := range pids {
		if !waitExit(pid, e.stateDir, 10*time.Second) {
			t.Fatalf("QEMU %d survived SIGKILL", pid)
		}
	}
	ents, _ := os.ReadDir(e.memDir)
	for _, ent := range ents {
		os.RemoveAll(filepath.Join(e.memDir, ent.Name()))
	}

	if m := e.machine("kid"); m.State != "stopped" || m.StopReason != "host-restart" || m.PID != 0 {
		t.Errorf("ls after the restart: kid %+v, want stopped by the host's restart", m)
	}
	if m := e.machine("src"); m.State != "hibernated" {
		t.Errorf("ls after the restart: src %+v, want hibernated", m)
	}
	if out := e.ok("ls").stdout; !strings.Contains(out, "host restarted: RAM gone") {
		t.Errorf("ls table does not say why kid stopped:\n%s", out)
	}
	var ts []struct {
		Name    string `json:"name"`
		RAMLost bool   `json:"ram_lost"`
	}
	e.jsonOK(&ts, "template", "ls")
	if i := slices.IndexFunc(ts, func(x struct {
		Name    string `json:"name"`
		RAMLost bool   `json:"ram_lost"`
	}) bool {
		return x.Name == "gold"
	}); i < 0 || !ts[i].RAMLost {
		t.Errorf("template ls after the restart: %+v, want gold marked ram_lost", ts)
	}
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"fork", "gold", "kid2"}, "lost its RAM"},
		{[]string{"start", "gold"}, "kept template"},
		{[]string{"start", "src"}, "hibernated"},
		{[]string{"start", "nope"}, "not found"},
	} {
		r := e.vmfork(c.args...)
		if r.code == 0 || !strings.Contains(r.stderr, c.says) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%v after the restart: %s, want one line saying %q", c.args, r, c.says)
		}
	}
	if n := len(e.list()); n != 2 {
		t.Errorf("refused commands left %d machines, want 2", n)
	}

	var res []startJSON
	e.jsonOK(&res, "start", "kid")
	if len(res) != 1 || res[0].State != "running" || res[0].MAC != before.MAC || res[0].Hostname != "kid" {
		t.Errorf("start kid = %+v, want it running with its MAC %s and hostname kid", res, before.MAC)
	}
	// The busybox guest's root is its initramfs: start put its identity back.
	if len(res) == 1 && !slices.Equal(res[0].Restored, []string{"hostname", "machine-id"}) {
		t.Errorf("start kid restored %v, want its hostname and machine-id", res[0].Restored)
	}
	if got := e.exec("kid", "sh", "-c", guestIdentity+"; cat /data/restart-mark"); got != kidID+"kept\n" {
		t.Errorf("kid after start: %q, want %q", got, kidID+"kept\n")
	}
	e.ok("resume", "src")
	e.exec("src", "true")
	var gc struct {
		Lost []string `json:"lost"`
	}
	e.jsonOK(&gc, "gc")
	if !slices.Equal(gc.Lost, []string{"gold"}) {
		t.Errorf("gc = %+v, want gold given up", gc)
	}
	if r := e.vmfork("fork", "gold"); r.code != 4 {
		t.Errorf("fork gold after gc: %s, want exit 4 (not found)", r)
	}
	// A started child has a RAM file of its own, and forks like a booted
	// machine; its disk is whole after gc took gold's layer away.
	e.ok("fork", "kid", "kid-1")
	if got := e.exec("kid-1", "cat", "/data/restart-mark"); got != "kept\n" {
		t.Errorf("kid's child reads %q on its disk, want kept", got)
	}
}
