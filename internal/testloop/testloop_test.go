package testloop

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestNew: the device has the size asked for, reads what is written to it,
// and is detached by remove, once.
func TestNew(t *testing.T) {
	dev, remove, err := New(t, 1<<20)
	if err != nil {
		t.Skip(err)
	}
	out, err := exec.Command("blockdev", "--getsize64", dev).Output()
	if err != nil || string(bytes.TrimSpace(out)) != "1048576" {
		t.Errorf("blockdev --getsize64 %s = %q, %v; want 1048576", dev, out, err)
	}
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("loop"), 4096); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := Bytes(t, dev, 4096, 4); string(got) != "loop" {
		t.Errorf("Bytes = %q, want loop", got)
	}
	backing := "/sys/block/" + filepath.Base(dev) + "/loop/backing_file"
	if _, err := os.Stat(backing); err != nil {
		t.Fatalf("%s attached has no backing file to read: %v", dev, err)
	}
	remove()
	remove() // a second call, and the cleanup's, do nothing
	// A detached loop device has no backing file.
	if b, err := os.ReadFile(backing); err == nil {
		t.Errorf("%s is still attached after remove, to %s", dev, bytes.TrimSpace(b))
	}
}
