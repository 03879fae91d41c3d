package proc

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestRunningZombie makes a real zombie: a child that exited and that this
// process has not waited for yet (Go reaps a child only in Wait). kill(pid, 0) succeeds for it; Running must
// not.
func TestRunningZombie(t *testing.T) {
	cmd := exec.Command("sh", "-c", "exit 0")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if zombieNow(pid) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child did not become a zombie")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("kill(zombie, 0) = %v; the test needs a zombie that kill -0 still finds", err)
	}
	if Running(pid) {
		t.Errorf("Running(zombie %d) = true, want false", pid)
	}
	if Alive(pid, "sh") {
		t.Errorf("Alive(zombie %d) = true, want false", pid)
	}
}

func zombieNow(pid int) bool {
	return !Running(pid) && syscall.Kill(pid, 0) == nil
}

func TestZombieStatParsing(t *testing.T) {
	for stat, want := range map[string]bool{
		"42 (qemu) S 1 2 3":          false,
		"42 (a) Z) Z 1 2 3":          true, // a ')' inside the name
		"42 (qemu-system-x86) R 1 2": false,
		"42 (x) X 1":                 true,
		"garbage":                    false,
	} {
		if got := zombie([]byte(stat)); got != want {
			t.Errorf("zombie(%q) = %v, want %v", stat, got, want)
		}
	}
}

func TestAlive(t *testing.T) {
	self := os.Getpid()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if !Alive(self, filepath.Base(exe)) {
		t.Errorf("Alive(self, own binary name) = false, want true")
	}
	if Alive(self, "no-such-marker-in-argv") {
		t.Errorf("Alive(self, foreign marker) = true, want false: a reused PID must not count")
	}
	if Alive(0, "") {
		t.Errorf("Alive(0) = true, want false")
	}
}
