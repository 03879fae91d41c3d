//go:build linux && amd64

package sharedmem

import (
	"errors"
	"fmt"
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

// unprivEnv asks the test binary to run unprivCheck ("PID:PATH") instead of
// tests.
const unprivEnv = "SHAREDMEM_UNPRIV_CHECK"

// nobody is the user the test runs the unprivileged side as.
const nobody = 65534

// unprivCheck does, without capabilities, what a fork does with a QEMU of
// its own user: find the RAM mapping of process pid (the file path), open
// it, and open it read-write after its mode was made a template's 0400. It
// prints "ok" or what failed.
func unprivCheck(arg string) int {
	fail := func(f string, a ...any) int { fmt.Printf(f+"\n", a...); return 1 }
	pidS, path, _ := strings.Cut(arg, ":")
	pid, _ := strconv.Atoi(pidS)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fail("stat: %v", err)
	}
	m, err := FindRAM(pid, helperPages*pageSize, "", st.Ino)
	if err != nil {
		return fail("FindRAM: %v", err)
	}
	f, err := m.File(os.O_RDONLY)
	if err != nil {
		return fail("File: %v", err)
	}
	var got unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &got); err != nil || got.Ino != st.Ino {
		return fail("File opened inode %d (%v), want %d", got.Ino, err, st.Ino)
	}
	f.Close()
	if err := os.Chmod(path, 0o400); err != nil {
		return fail("chmod: %v", err)
	}
	w, err := m.Writable()
	if err != nil {
		return fail("Writable: %v", err)
	}
	defer w.Close()
	if _, err := w.WriteAt([]byte{'w'}, 0); err != nil {
		return fail("write: %v", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		return fail("mode after Writable: %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	fmt.Println("ok")
	return 0
}

// TestFileWithoutCapabilities opens a process's RAM mapping as a user
// without CAP_SYS_ADMIN (nobody, when the test runs as root), as a fork by an
// ordinary user does: /proc/PID/map_files is closed to it, QEMU's own
// descriptor of the file is not.
func TestFileWithoutCapabilities(t *testing.T) {
	bin, cred := os.Args[0], (*syscall.Credential)(nil)
	dir := t.TempDir()
	if os.Geteuid() == 0 {
		// Everything the unprivileged side runs and opens, where nobody
		// may reach it and own it.
		var err error
		if dir, err = os.MkdirTemp("", "sharedmem-unpriv-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		bin = filepath.Join(dir, "sharedmem.test")
		copyExec(t, os.Args[0], bin)
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cred = &syscall.Credential{Uid: nobody, Gid: nobody}
	}
	a, b := filepath.Join(dir, "a.ram"), filepath.Join(dir, "b.ram")
	fillFile(t, a, 'a')
	fillFile(t, b, 'b')
	if cred != nil {
		for _, p := range []string{a, b} {
			if err := os.Chown(p, nobody, nobody); err != nil {
				t.Fatal(err)
			}
		}
	}
	h := startHelperAs(t, bin, cred, a, b)
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), unprivEnv+"="+strconv.Itoa(h.cmd.Process.Pid)+":"+a)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("unprivileged open of the helper's RAM mapping: %v: %s", err, out)
	}
	if got := h.ask("get 0"); got != strconv.Itoa('w') {
		t.Fatalf("the helper reads %s at page 0, want %d ('w') written through the file", got, 'w')
	}
}

// TestFileByFDChecksInode: the descriptor fallback opens only the mapped
// file, and says so when the process holds no descriptor of it.
func TestFileByFDChecksInode(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.ram")
	fillFile(t, a, 'a')
	f, err := os.OpenFile(a, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, helperPages*pageSize, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	m, err := FindRAM(os.Getpid(), helperPages*pageSize, "", inodeOf(t, a))
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.fileByFD(os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	f.Close()
	if g, err := m.fileByFD(os.O_RDONLY); err == nil || !strings.Contains(err.Error(), "holds no descriptor") {
		if g != nil {
			g.Close()
		}
		t.Fatalf("fileByFD with the descriptor closed = %v, want \"holds no descriptor\"", err)
	}
}

func copyExec(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// A refused trace names the capability and the host setting, in one line,
// for each Yama policy; other errors pass unchanged.
func TestPtraceDeniedNamesCapability(t *testing.T) {
	old := yamaScope
	t.Cleanup(func() { yamaScope = old })
	dir := t.TempDir()
	for scope, want := range map[string]string{
		"":  "CAP_SYS_PTRACE (run vmfork as the user",
		"0": "CAP_SYS_PTRACE (run vmfork as the user",
		"1": "sysctl -w kernel.yama.ptrace_scope=0",
		"2": "kernel.yama.ptrace_scope is 2",
		"3": "kernel.yama.ptrace_scope is 3",
	} {
		yamaScope = filepath.Join(dir, "none")
		if scope != "" {
			yamaScope = filepath.Join(dir, "scope"+scope)
			if err := os.WriteFile(yamaScope, []byte(scope+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		err := ptraceDenied(42, fmt.Errorf("ptrace seize: %w", unix.EPERM))
		if !errors.Is(err, unix.EPERM) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "CAP_SYS_PTRACE") ||
			strings.Contains(err.Error(), "\n") {
			t.Errorf("scope %q: %v; want one line with %q", scope, err, want)
		}
	}
	if err := ptraceDenied(42, unix.ESRCH); err != unix.ESRCH {
		t.Errorf("ESRCH became %v", err)
	}
}
