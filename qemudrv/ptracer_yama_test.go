package qemudrv

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// yamaAttachEnv asks the test binary to attach to a PID ("PID") with
// PTRACE_SEIZE, detach, and print "ok" or the error, instead of testing.
const yamaAttachEnv = "QEMUDRV_YAMA_ATTACH"

func init() {
	if s := os.Getenv(yamaAttachEnv); s != "" {
		pid, _ := strconv.Atoi(s)
		if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, 0, 0, 0); e != 0 {
			os.Stdout.WriteString(e.Error() + "\n")
			os.Exit(1)
		}
		unix.PtraceDetach(pid)
		os.Stdout.WriteString("ok\n")
		os.Exit(0)
	}
}

// Under Yama's ptrace_scope 1 an ordinary user's process that is not an
// ancestor (a later vmfork fork) may trace a process started through the
// shim, and not one started without it. Needs root (to set the scope and
// act as nobody) and a kernel with Yama: this host's has none; Debian's
// and Ubuntu's have (run it in the Debian guest: docs, README "Yama").
func TestPtracerShimUnderYama(t *testing.T) {
	old, err := os.ReadFile(yamaScope)
	if err != nil || os.Geteuid() != 0 {
		t.Skipf("needs root and Yama (%v, euid %d)", err, os.Geteuid())
	}
	if err := os.WriteFile(yamaScope, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(yamaScope, old, 0o644) })
	// The test binary where nobody may run it.
	dir, err := os.MkdirTemp("", "qemudrv-yama-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "qemudrv.test")
	in, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err == nil {
		_, err = io.Copy(out, in)
		out.Close()
	}
	in.Close()
	if err != nil {
		t.Fatal(err)
	}
	nobody := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	start := func(shim bool) *exec.Cmd {
		cmd := exec.Command("/bin/sleep", "60")
		if shim {
			cmd = exec.Command(bin, "/bin/sleep", "60")
			cmd.Env = append(os.Environ(), ptracerShimEnv+"=1")
		}
		cmd.SysProcAttr = nobody
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	attach := func(pid int) string {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), yamaAttachEnv+"="+strconv.Itoa(pid))
		cmd.SysProcAttr = nobody
		out, _ := cmd.CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	plain, shimmed := start(false), start(true)
	waitExec(t, shimmed.Process.Pid, "sleep")
	if got := attach(plain.Process.Pid); got == "ok" {
		t.Errorf("a sibling attached to a process started without the shim under scope 1: Yama is not enforcing, the test tells nothing")
	}
	if got := attach(shimmed.Process.Pid); got != "ok" {
		t.Errorf("attach to a process started through the shim under scope 1: %s; want ok", got)
	}
}

// waitExec waits until pid runs a program named comm (the shim has
// exec'd).
func waitExec(t *testing.T, pid int, comm string) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); strings.TrimSpace(string(b)) == comm {
			return
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 10e6}, nil)
	}
	t.Fatalf("pid %d never ran %s", pid, comm)
}
