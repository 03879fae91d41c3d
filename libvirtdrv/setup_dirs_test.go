package libvirtdrv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOpenRAMDirs(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "libvirt", "qemu")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	// As a libvirtd started under umask 077 made it.
	if err := os.Chmod(filepath.Join(base, "libvirt"), 0o700); err != nil {
		t.Fatal(err)
	}
	mode := func(p string) os.FileMode {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode().Perm()
	}

	got, err := openRAMDirs(base, dir, true)
	if err != nil || len(got) != 1 || mode(filepath.Join(base, "libvirt")) != 0o700 {
		t.Fatalf("dry run: %v, %v, mode %o; want one change reported and none made", got, err, mode(filepath.Join(base, "libvirt")))
	}
	got, err = openRAMDirs(base, dir, false)
	if err != nil || len(got) != 1 || !strings.Contains(got[0], "was 0700") {
		t.Fatalf("openRAMDirs = %v, %v; want one change from 0700", got, err)
	}
	if m := mode(filepath.Join(base, "libvirt")); m != 0o711 {
		t.Errorf("libvirt/ is %o, want 0711", m)
	}
	if got, err := openRAMDirs(base, dir, false); err != nil || len(got) != 0 {
		t.Errorf("second run = %v, %v; want nothing to change", got, err)
	}
	// A directory libvirtd has not made yet, and one not under base.
	if got, err := openRAMDirs(base, filepath.Join(base, "none", "qemu"), false); err != nil || len(got) != 0 {
		t.Errorf("missing dirs = %v, %v; want nothing", got, err)
	}
	if got, err := openRAMDirs(base, "/elsewhere/libvirt/qemu", false); err != nil || len(got) != 0 {
		t.Errorf("outside base = %v, %v; want nothing", got, err)
	}
}
