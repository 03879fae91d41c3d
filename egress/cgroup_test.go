package egress

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCgroup2Mount(t *testing.T) {
	for file, want := range map[string]string{
		// This project's test host: v1 controllers, cgroup2 beside them.
		"mountinfo-hybrid":  "/sys/fs/cgroup/unified",
		"mountinfo-unified": "/sys/fs/cgroup",
		// A cgroup2 mounted from below its root is skipped; the name is
		// unescaped.
		"mountinfo-container": "/mnt/cg root",
		"mountinfo-v1only":    "",
	} {
		f, err := os.Open(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		got, err := cgroup2Mount(f)
		f.Close()
		if want == "" {
			if !errors.Is(err, ErrUnavailable) {
				t.Errorf("%s: got %q, %v, want ErrUnavailable", file, got, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%s: got %q, %v, want %q", file, got, err, want)
		}
	}
}

// needRoot skips a test that changes the host's nftables, cgroups or
// network namespaces when the test does not run as root.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: it makes network namespaces, nftables tables and cgroups")
	}
}

// testMachine is a machine name of this test's own, so that tests that
// share the host's cgroups and root namespace never meet.
func testMachine(t *testing.T) string {
	return fmt.Sprintf("egress-unit-%d-%s", os.Getpid(), strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
}

func TestCgroupLifecycle(t *testing.T) {
	needRoot(t)
	m := testMachine(t)
	t.Cleanup(func() { RemoveCgroup(m) })
	if _, err := OpenCgroup(m); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "vmfork/"+m) {
		t.Errorf("OpenCgroup before CreateCgroup: %v, want not-exist naming it", err)
	}
	cg, err := CreateCgroup(m)
	if err != nil {
		t.Fatal(err)
	}
	again, err := CreateCgroup(m)
	if err != nil || *again != *cg {
		t.Errorf("CreateCgroup again: %+v, %v, want %+v (idempotent)", again, err, cg)
	}
	if cg.Level != 2 || cg.Rel != "vmfork/"+m || cg.ID == 0 {
		t.Errorf("cgroup %+v: want level 2, vmfork/%s, an id", cg, m)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := cg.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if pids, err := cg.Procs(); err != nil || !slices.Contains(pids, cmd.Process.Pid) {
		t.Errorf("procs %v, %v: want %d in it", pids, err, cmd.Process.Pid)
	}
	if err := RemoveCgroup(m); err == nil || !strings.Contains(err.Error(), "still holds processes") {
		t.Errorf("removing a cgroup with a process: %v, want an error saying so", err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := RemoveCgroup(m); err != nil {
		t.Fatal(err)
	}
	if err := RemoveCgroup(m); err != nil {
		t.Errorf("RemoveCgroup again: %v, want nil (idempotent)", err)
	}
	if err := cg.Add(os.Getpid()); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Add to a removed cgroup: %v, want one naming it", err)
	}
	// Made again, it is another cgroup: the old value must not pass.
	if _, err := CreateCgroup(m); err != nil {
		t.Fatal(err)
	}
	if err := cg.check(); err == nil || !strings.Contains(err.Error(), "made again") {
		t.Errorf("a stale Cgroup: %v, want an error saying it was made again", err)
	}
}
