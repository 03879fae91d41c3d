//go:build linux && amd64

package sharedmem

import (
	"bufio"
	"bytes"
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

const helperEnv = "SHAREDMEM_REMAP_HELPER"

// TestMain runs the helper process of TestRemapAndCopyPrivate when asked to:
// a process that maps a file share=on as QEMU does and waits in read(2).
func TestMain(m *testing.M) {
	if p := os.Getenv(helperEnv); p != "" {
		os.Exit(remapHelper(p))
	}
	if p := os.Getenv(unprivEnv); p != "" {
		os.Exit(unprivCheck(p))
	}
	os.Exit(m.Run())
}

const helperPages = 64

// remapHelper maps path MAP_SHARED and serves commands on stdin:
// "get N" prints page N's first byte, "set N B" writes byte B there, "drop
// N" discards page N.
func remapHelper(paths string) int {
	// mapped:other[:more...]: more are held open too, read-only (the
	// delta files a fakeMonitor with pid hands over by their descriptors).
	parts := strings.Split(paths, ":")
	path, other := parts[0], parts[len(parts)-1]
	if len(parts) > 1 {
		other = parts[1]
	}
	for _, p := range parts[2:] {
		if _, err := os.Open(p); err != nil {
			fmt.Println("error", err)
			return 1
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	// The file to remap onto, opened read-only: vmfork hands QEMU such a
	// descriptor with QMP add-fd.
	g, err := os.Open(other)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, helperPages*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Printf("ready %d %d\n", f.Fd(), g.Fd())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var n, b int
		switch w := strings.Fields(in.Text()); w[0] {
		case "get":
			n, _ = strconv.Atoi(w[1])
			fmt.Println(mem[n*pageSize])
		case "set":
			n, _ = strconv.Atoi(w[1])
			b, _ = strconv.Atoi(w[2])
			mem[n*pageSize] = byte(b)
			fmt.Println("ok")
		case "drop":
			// What QEMU does to a page the guest gave back: a private
			// mapping then shows the file again there.
			n, _ = strconv.Atoi(w[1])
			if err := unix.Madvise(mem[n*pageSize:(n+1)*pageSize], unix.MADV_DONTNEED); err != nil {
				fmt.Println("error", err)
				continue
			}
			fmt.Println("ok")
		}
	}
	return 0
}

func fillFile(t *testing.T, path string, b byte) {
	t.Helper()
	if err := os.WriteFile(path, bytes.Repeat([]byte{b}, helperPages*pageSize), 0o600); err != nil {
		t.Fatal(err)
	}
}

func inodeOf(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// helper is a running remapHelper: it maps one file shared and holds a
// read-only descriptor of another.
type helper struct {
	cmd         *exec.Cmd
	ask         func(string) string
	blockFD, fd int
}

// startHelper starts a helper mapping mapped, holding other; it is killed
// when the test ends.
func startHelper(t *testing.T, mapped, other string) *helper {
	t.Helper()
	return startHelperAs(t, os.Args[0], nil, mapped, other)
}

// startHelperAs is startHelper for test binary bin run with cred (nil: as
// this process).
func startHelperAs(t *testing.T, bin string, cred *syscall.Credential, mapped, other string) *helper {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Env = append(os.Environ(), helperEnv+"="+mapped+":"+other)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := bufio.NewReader(stdout)
	h := &helper{cmd: cmd}
	h.ask = func(q string) string {
		t.Helper()
		if q != "" {
			io.WriteString(stdin, q+"\n")
		}
		l, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("helper: %v", err)
		}
		return strings.TrimSpace(l)
	}
	if _, err := fmt.Sscanf(h.ask(""), "ready %d %d", &h.blockFD, &h.fd); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestRemapAndCopyPrivate remaps a live process's shared file mapping onto
// another file, privately, and checks what the process sees and writes, what
// its descriptor refers to, and that CopyPrivate captures its writes.
func TestRemapAndCopyPrivate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test traces another process and reads its /proc/PID/mem: run it as root, as CI does")
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.ram"), filepath.Join(dir, "b.ram")
	fillFile(t, a, 'a')
	fillFile(t, b, 'b')
	h := startHelper(t, a, b)
	cmd, ask, blockFD, fd := h.cmd, h.ask, h.blockFD, h.fd
	m, err := FindRAM(cmd.Process.Pid, helperPages*pageSize, ".ram", 0)
	if err != nil || !m.Shared || m.Inode != inodeOf(t, a) {
		t.Fatalf("FindRAM = %+v, %v; want the shared mapping of a.ram", m, err)
	}
	if err := CanRemap(cmd.Process.Pid); err != nil {
		t.Fatalf("CanRemap: %v", err)
	}
	if got := ask("get 0"); got != strconv.Itoa('a') {
		t.Fatalf("after CanRemap page 0 reads %s, want %d ('a'): the helper must run on untouched", got, 'a')
	}
	if err := Remap(m, fd, blockFD); err != nil {
		t.Fatal(err)
	}
	if got := ask("get 3"); got != strconv.Itoa('b') {
		t.Fatalf("after remap page 3 reads %s, want %d ('b')", got, 'b')
	}
	if got := ask("set 5 120"); got != "ok" {
		t.Fatalf("write after remap: %s", got)
	}
	if data, _ := os.ReadFile(b); data[5*pageSize] != 'b' {
		t.Fatalf("b.ram changed under a private mapping: page 5 = %q", data[5*pageSize])
	}
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/fd/%d", cmd.Process.Pid, blockFD), &st); err != nil || st.Ino != inodeOf(t, b) {
		t.Fatalf("helper's fd %d is inode %d (%v), want b.ram's %d", blockFD, st.Ino, err, inodeOf(t, b))
	}
	m2, err := FindRAM(cmd.Process.Pid, helperPages*pageSize, "", inodeOf(t, b))
	if err != nil || m2.Shared || m2.Start != m.Start {
		t.Fatalf("after remap FindRAM = %+v, %v; want a private mapping at %#x", m2, err, m.Start)
	}
	c := filepath.Join(dir, "c.ram")
	fillFile(t, c, 'b')
	cf, err := os.OpenFile(c, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cf.Close()
	ds, err := CopyPrivate(t.Context(), m2, cf)
	if err != nil {
		t.Fatal(err)
	}
	if ds.CopiedBytes != pageSize {
		t.Errorf("CopyPrivate copied %d bytes, want the one written page (%d)", ds.CopiedBytes, pageSize)
	}
	data, _ := os.ReadFile(c)
	if data[5*pageSize] != 120 || data[6*pageSize] != 'b' {
		t.Errorf("copy holds %d at page 5 and %q at page 6, want 120 and 'b'", data[5*pageSize], data[6*pageSize])
	}
	if got := ask("get 5"); got != "120" {
		t.Errorf("helper lost its write: page 5 reads %s", got)
	}
}
