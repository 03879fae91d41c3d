package qemudrv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// spawnHelperEnv makes this test binary a CLI that spawns `sleep` as a
// QEMU (with dieWithCLI as the variable says), prints its pid and exits.
const spawnHelperEnv = "VMFORK_TEST_SPAWN_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(spawnHelperEnv); mode != "" {
		p, err := spawn("sleep", []string{"100"}, os.Getenv("VMFORK_TEST_SPAWN_LOG"), spawnOptions{dieWithCLI: mode == "die"})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(p.pid)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSpawnDieWithCLI: a process spawned with dieWithCLI ends with the CLI
// that started it (a fork --to's loaded QEMU when vmfork is killed); one
// without outlives it, as every machine's QEMU must.
func TestSpawnDieWithCLI(t *testing.T) {
	for _, tc := range []struct {
		mode     string
		survives bool
	}{{"die", false}, {"outlive", true}} {
		t.Run(tc.mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^$")
			cmd.Env = append(os.Environ(), spawnHelperEnv+"="+tc.mode, "VMFORK_TEST_SPAWN_LOG="+filepath.Join(t.TempDir(), "log"))
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("helper: %v: %s", err, out)
			}
			line, _ := bufio.NewReader(strings.NewReader(string(out))).ReadString('\n')
			pid, err := strconv.Atoi(strings.TrimSpace(line))
			if err != nil {
				t.Fatalf("helper printed %q", out)
			}
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
			gone := false
			for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if running(pid) {
					continue
				}
				gone = true
				break
			}
			if gone == tc.survives {
				t.Fatalf("spawned pid %d gone=%v after its CLI exited, want gone=%v", pid, gone, !tc.survives)
			}
		})
	}
}

// running: pid exists and is not a zombie (PID 1 may reap it late).
func running(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}
