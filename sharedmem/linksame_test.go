package sharedmem

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// linkSameFile, the fallback of a delta's base name when the source's QEMU
// maps its file through another mount namespace's mount: it links the
// mapping's name only while that name is still the mapped file.
func TestLinkSameFile(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "src.1.ram")
	if err := os.WriteFile(name, []byte("ram"), 0o600); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(name, &st); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "src.2.base.ram")
	if ok, err := linkSameFile(name, base, &st); !ok || err != nil {
		t.Fatalf("link of the mapped file's own name: %v, %v", ok, err)
	}
	var got unix.Stat_t
	if err := unix.Stat(base, &got); err != nil || got.Ino != st.Ino {
		t.Fatalf("base %s is not the mapped file (%v)", base, err)
	}
	// The name now names another file: nothing is linked.
	os.Remove(name)
	if err := os.WriteFile(name, []byte("other"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "src.3.base.ram")
	if ok, err := linkSameFile(name, other, &st); ok || err != nil {
		t.Errorf("link of a name that moved on: %v, %v; want false, nil", ok, err)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Errorf("%s made for another file", other)
	}
	if ok, err := linkSameFile("", other, &st); ok || err != nil {
		t.Errorf("no name: %v, %v; want false, nil", ok, err)
	}
}
