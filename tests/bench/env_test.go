package bench

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmfork/vmfork"
)

func TestGuestFiles(t *testing.T) {
	busybox := t.TempDir()
	g, err := guestFiles(busybox, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(busybox, "initrd.gz"); g.Initrd != want || g.Append != "" {
		t.Errorf("busybox guest: got initrd %q append %q, want %q and none", g.Initrd, g.Append, want)
	}
	if _, err := guestFiles(busybox, "networkd-dbus"); !errors.Is(err, vmfork.ErrInvalid) {
		t.Errorf("variant of the busybox guest: got %v, want ErrInvalid", err)
	}

	debian := t.TempDir()
	variants := "ifupdown-dbus\troot=/dev/vda a\nnetworkd-nodbus\troot=/dev/vda b\n"
	if err := os.WriteFile(filepath.Join(debian, "variants"), []byte(variants), 0o644); err != nil {
		t.Fatal(err)
	}
	for variant, want := range map[string]string{"": "root=/dev/vda a", "networkd-nodbus": "root=/dev/vda b"} {
		g, err := guestFiles(debian, variant)
		if err != nil {
			t.Fatalf("variant %q: %v", variant, err)
		}
		if g.Append != want || g.Disk != filepath.Join(debian, "root.qcow2") || g.Initrd != filepath.Join(debian, "initrd.img") {
			t.Errorf("variant %q: got %+v, want append %q with root.qcow2 and initrd.img", variant, g, want)
		}
	}
	if _, err := guestFiles(debian, "nm-dbus"); !errors.Is(err, vmfork.ErrInvalid) {
		t.Errorf("unknown variant: got %v, want ErrInvalid", err)
	}

	// A build directory behind OUTDIR/current: the files are named by it.
	outdir := t.TempDir()
	if err := os.Rename(debian, filepath.Join(outdir, "0123456789ab")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("0123456789ab", filepath.Join(outdir, "current")); err != nil {
		t.Fatal(err)
	}
	g, err = guestFiles(outdir, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(outdir, "0123456789ab", "root.qcow2"); g.Disk != want {
		t.Errorf("through current: got disk %q, want %q", g.Disk, want)
	}
}
