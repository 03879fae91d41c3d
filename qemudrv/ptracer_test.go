package qemudrv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// The shim execs QEMU's command line in its own process (the PID spawn
// reports is QEMU's), with the descriptors spawn passes and without its
// own environment variable.
func TestPtracerShimExecs(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// As spawn runs it: /proc/self/exe, which in the forked child is
	// still this binary.
	cmd := exec.Command("/proc/self/exe", "/bin/sh", "-c", `echo "$$ ${`+ptracerShimEnv+`:-unset}"; echo fd3 >&3`)
	cmd.Env = append(os.Environ(), ptracerShimEnv+"=1")
	cmd.ExtraFiles = []*os.File{w}
	out, err := cmd.Output()
	w.Close()
	if err != nil {
		t.Fatalf("shim: %v: %s", err, out)
	}
	if want := strconv.Itoa(cmd.Process.Pid) + " unset\n"; string(out) != want {
		t.Errorf("shim ran %q, want %q (the same PID, the variable gone)", out, want)
	}
	var b [8]byte
	if n, _ := r.Read(b[:]); string(b[:n]) != "fd3\n" {
		t.Errorf("descriptor 3 through the shim: read %q", b[:n])
	}
}

// QEMU goes through the shim only where Yama's scope is 1 and this
// process cannot trace anyway.
func TestNeedPtracerShim(t *testing.T) {
	oldScope, oldCap := yamaScope, hasCap
	t.Cleanup(func() { yamaScope, hasCap = oldScope, oldCap })
	dir := t.TempDir()
	for _, c := range []struct {
		scope   string // "" for no Yama
		ptracer bool
		want    bool
	}{
		{"", false, false}, {"0", false, false}, {"1", false, true}, {"1", true, false}, {"2", false, false},
	} {
		yamaScope = filepath.Join(dir, "none")
		if c.scope != "" {
			yamaScope = filepath.Join(dir, "scope"+c.scope)
			os.WriteFile(yamaScope, []byte(c.scope+"\n"), 0o644)
		}
		hasCap = func(int) bool { return c.ptracer }
		if got := needPtracerShim(); got != c.want {
			t.Errorf("scope %q, CAP_SYS_PTRACE %v: shim %v, want %v", c.scope, c.ptracer, got, c.want)
		}
	}
}
