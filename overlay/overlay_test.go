package overlay

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// testdata/base.qcow2 and top.qcow2 (backing "base.qcow2", relative) were
// made with qemu-img 7.2.22 (QEMU 7.2, Debian 1:7.2+dfsg-7+deb12u18+b3):
//
//	qemu-img create -f qcow2 -o cluster_size=512 base.qcow2 1M
//	qemu-img create -f qcow2 -o cluster_size=512 -b base.qcow2 -F qcow2 top.qcow2

func TestChain(t *testing.T) {
	top, _ := filepath.Abs("testdata/top.qcow2")
	chain, err := Chain(top)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 {
		t.Fatalf("chain has %d layers, want 2: %+v", len(chain), chain)
	}
	base, _ := filepath.Abs("testdata/base.qcow2")
	for i, want := range []string{top, base} {
		l := chain[i]
		if l.Path != want || l.Format != "qcow2" || l.VirtualSize != 1<<20 || l.AllocatedBytes <= 0 {
			t.Errorf("layer %d = %+v, want %s, qcow2, 1 MiB, allocated > 0", i, l, want)
		}
	}
}

func TestChainMissingBacking(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile("testdata/top.qcow2")
	if err != nil {
		t.Fatal(err)
	}
	top := filepath.Join(dir, "top.qcow2")
	if err := os.WriteFile(top, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Chain(top); err == nil || !strings.Contains(err.Error(), "base.qcow2") {
		t.Errorf("Chain with a missing backing file = %v, want an error naming base.qcow2", err)
	}
}

func TestFormat(t *testing.T) {
	for path, want := range map[string]string{"testdata/base.qcow2": "qcow2", "testdata/raw.img": "raw"} {
		got, err := Format(path)
		if err != nil || string(got) != want {
			t.Errorf("Format(%s) = %q, %v; want %q", path, got, err, want)
		}
	}
}

// stubQemuImg points VMFORK_QEMU_IMG at a script that records its arguments.
func stubQemuImg(t *testing.T) (argsFile string) {
	t.Helper()
	dir := t.TempDir()
	argsFile = filepath.Join(dir, "args")
	stub := filepath.Join(dir, "qemu-img")
	script := "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done > " + argsFile + "\n"
	if err := os.WriteFile(stub, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VMFORK_QEMU_IMG", stub)
	return argsFile
}

func readArgs(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

func TestCreateNamesBackingFormat(t *testing.T) {
	raw, _ := filepath.Abs("testdata/raw.img")
	out := filepath.Join(t.TempDir(), "child.qcow2")
	if err := Create(t.Context(), raw, out); err != nil {
		t.Fatal(err)
	}
	chain, err := Chain(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []Layer{{Path: out, Format: "qcow2", VirtualSize: 4096}, {Path: raw, Format: "raw", VirtualSize: 4096}}
	for i := range chain {
		chain[i].AllocatedBytes = 0
	}
	if !slices.Equal(chain, want) {
		t.Errorf("chain of a new overlay = %+v, want %+v", chain, want)
	}
	if err := os.WriteFile(out, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Create(t.Context(), raw, out); err == nil || !errors.Is(err, os.ErrExist) || !strings.Contains(err.Error(), out) {
		t.Errorf("Create over an existing file = %v, want an error naming it", err)
	}
	if data, _ := os.ReadFile(out); string(data) != "mine" {
		t.Errorf("Create over an existing file changed it to %d bytes", len(data))
	}
}

func TestRebaseArgs(t *testing.T) {
	args := stubQemuImg(t)
	if err := Rebase(t.Context(), "/m/top.qcow2", "testdata/base.qcow2"); err != nil {
		t.Fatal(err)
	}
	want := []string{"rebase", "-q", "-f", "qcow2", "-b", "testdata/base.qcow2", "-F", "qcow2", "/m/top.qcow2"}
	if got := readArgs(t, args); !slices.Equal(got, want) {
		t.Errorf("Rebase args = %q, want %q", got, want)
	}
}

func TestInUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.qcow2")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if busy, err := InUse(path); err != nil || busy {
		t.Fatalf("InUse of an idle file = %v, %v; want false", busy, err)
	}
	// Take a shared lock on one of QEMU's lock bytes, as QEMU does.
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_RDLCK, Start: 201, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		t.Fatal(err)
	}
	if busy, err := InUse(path); err != nil || !busy {
		t.Fatalf("InUse of a locked file = %v, %v; want true", busy, err)
	}
}
