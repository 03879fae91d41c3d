//go:build integration

package tests

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPrivateFilesAndSandbox checks what issue 12's security section asks of
// the embedded driver: the state and mem dirs and everything in them are
// vmfork's alone (sockets 0600, no group or other bits on any file), QEMU
// runs under the seccomp sandbox, and strings from the command line reach
// the guest as data, never as shell text.
func TestPrivateFilesAndSandbox(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	// Dirs made by someone else with open modes become private.
	os.Chmod(e.stateDir, 0o755)
	os.Chmod(e.memDir, 0o755)
	src := e.boot("sec")
	e.ok("fork", "sec", "sec-1")
	kid := e.machine("sec-1")

	for _, d := range []string{e.stateDir, e.memDir} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if perm := st.Mode().Perm(); perm&0o066 != 0 {
			t.Errorf("%s is %04o: group or others may read or write it", d, perm)
		}
	}
	for _, root := range []string{e.stateDir, e.memDir} {
		filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
			if err != nil || p == root {
				return nil
			}
			perm := info.Mode().Perm()
			if info.Mode()&os.ModeSocket != 0 && perm != 0o600 {
				t.Errorf("socket %s is %04o, want 0600", p, perm)
			}
			if !info.IsDir() && perm&0o077 != 0 {
				t.Errorf("%s is %04o: group or others have access", p, perm)
			}
			return nil
		})
	}
	for _, pid := range []int{src.PID, kid.PID} {
		cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			t.Fatal(err)
		}
		args := strings.Split(string(cmdline), "\x00")
		found := false
		for i := range args[:len(args)-1] {
			if args[i] == "-sandbox" && strings.HasPrefix(args[i+1], "on,") && strings.Contains(args[i+1], "spawn=deny") {
				found = true
			}
		}
		if !found {
			t.Errorf("QEMU %d runs without -sandbox on,...,spawn=deny: %q", pid, args)
		}
	}

	// Shell text in values that reach the guest stays data: an environment
	// value, an argument, and a hostname pattern (refused: not a hostname).
	marker := "/tmp/vmfork-injected"
	e.ok("exec", "sec-1", "--env", "X=$(touch "+marker+")", "--", "sh", "-c", `printf %s "$X" >/dev/null`)
	e.ok("exec", "sec-1", "--", "echo", "`touch "+marker+"`;touch "+marker)
	if r := e.vmfork("fork", "sec", "sec-2", "--hostname", "a;touch "+marker); r.code != 2 {
		t.Errorf("fork with a hostname holding shell text: %s, want exit 2", r)
	}
	if out := e.exec("sec-1", "sh", "-c", "test -e "+marker+" && echo injected || echo clean"); strings.TrimSpace(out) != "clean" {
		t.Errorf("a value given on the command line ran as shell text in the guest")
	}
	if out := e.exec("sec", "sh", "-c", "test -e "+marker+" && echo injected || echo clean"); strings.TrimSpace(out) != "clean" {
		t.Errorf("the refused fork ran shell text in the source")
	}
	e.ok("rm", "sec-1")
	e.ok("rm", "sec")
}
