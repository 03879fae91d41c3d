//go:build integration

package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadInput checks that bad input gets a one-line error naming the
// problem and a non-zero exit code, and changes nothing.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	g := e.guest
	boot := func(name string, extra ...string) []string {
		return append([]string{"boot", name, "--kernel", g.Kernel, "--initrd", g.Initrd, "--memory", "256M"}, extra...)
	}
	cases := []struct {
		name string
		args []string
		code int
		says string
	}{
		{"dotdot name", boot("../x"), 2, `"../x" is not valid`},
		{"empty name", boot(""), 2, "must not be empty"},
		{"upper name", boot("UPPER"), 2, `"UPPER" is not valid`},
		{"long name", boot(strings.Repeat("a", 64)), 2, "limit is 63"},
		{"missing kernel", []string{"boot", "k", "--kernel", "/nonexistent/vmlinuz"}, 2, `kernel "/nonexistent/vmlinuz" does not exist`},
		{"bad memory", boot("m", "--memory", "lots"), 2, "memory size"},
		{"bad port", boot("p", "--port", "22:abc"), 2, "port"},
		{"unknown machine exec", []string{"exec", "nope", "--", "true"}, 4, `machine "nope": not found`},
		{"unknown machine rm", []string{"rm", "nope"}, 4, `machine "nope": not found`},
		{"unknown machine stop", []string{"stop", "nope"}, 4, `machine "nope": not found`},
		{"exec without command", []string{"exec", "nope"}, 2, "needs a machine name and a command"},
		{"boot without name", []string{"boot"}, 2, "exactly one machine name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.vmfork(c.args...)
			if r.code != c.code {
				t.Errorf("exit code %d, want %d (%s)", r.code, c.code, r)
			}
			if !strings.Contains(r.stderr, c.says) {
				t.Errorf("stderr %q does not say %q", r.stderr, c.says)
			}
			if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n != 0 {
				t.Errorf("error is %d lines, want one: %q", n+1, r.stderr)
			}
			assertNothingCreated(t, e)
		})
	}
}

// TestBootFailures covers a taken name and a QEMU that dies during boot.
func TestBootFailures(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	m := e.boot("taken")
	r := e.vmfork("boot", "taken", "--kernel", e.guest.Kernel, "--initrd", e.guest.Initrd)
	if r.code != 2 || !strings.Contains(r.stderr, `machine "taken": already exists`) {
		t.Errorf("boot of a taken name: %s, want exit 2 and 'already exists'", r)
	}
	if !ownedQEMU(m.PID, e.stateDir) {
		t.Errorf("the first machine's QEMU died after a clashing boot")
	}

	// A kernel file QEMU cannot load: QEMU exits during boot and its own
	// message reaches the user; nothing of the machine is left.
	junk := filepath.Join(t.TempDir(), "junk-kernel")
	if err := os.WriteFile(junk, []byte(strings.Repeat("not a kernel\n", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	r = e.vmfork("boot", "dies", "--kernel", junk, "--memory", "128M")
	if r.code != 1 || !strings.Contains(r.stderr, "QEMU exited") || !strings.Contains(strings.ToLower(r.stderr), "kernel") {
		t.Errorf("boot with a junk kernel: %s, want exit 1 with QEMU's log tail", r)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "machines", "dies")); !os.IsNotExist(err) {
		t.Errorf("failed machine's directory still exists: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.memDir, "dies.ram")); !os.IsNotExist(err) {
		t.Errorf("failed machine's RAM file still exists: %v", err)
	}
	if pids := e.qemuProcesses(); len(pids) != 1 {
		t.Errorf("QEMU processes = %v, want only the first machine's", pids)
	}
	e.ok("rm", "taken")
}

func assertNothingCreated(t *testing.T, e *env) {
	t.Helper()
	for _, pattern := range []string{filepath.Join(e.stateDir, "machines", "*"), filepath.Join(e.memDir, "*")} {
		if left, _ := filepath.Glob(pattern); len(left) != 0 {
			t.Errorf("bad input created %v", left)
		}
	}
	if pids := e.qemuProcesses(); len(pids) != 0 {
		t.Errorf("bad input started QEMU: %v", pids)
	}
}
