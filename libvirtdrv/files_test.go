package libvirtdrv

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		dir, path string
		want      bool
	}{
		{"/var/lib/vmfork", "/var/lib/vmfork", true},
		{"/var/lib/vmfork", "/var/lib/vmfork/machines/web/disk.1.qcow2", true},
		{"/var/lib/vmfork", "/var/lib/vmfork/../libvirt/images/web.qcow2", false},
		{"/var/lib/vmfork", "/var/lib/vmfork2/x", false},
		{"/var/lib/vmfork", "/srv/web.qcow2", false},
	} {
		if got := within(c.dir, c.path); got != c.want {
			t.Errorf("within(%s, %s) = %v, want %v", c.dir, c.path, got, c.want)
		}
	}
}

func TestRelativeBacking(t *testing.T) {
	// testdata of the overlay package, made with qemu-img 7.2 (see there).
	for path, want := range map[string]bool{
		"../overlay/testdata/top.qcow2":  true, // backing "base.qcow2"
		"../overlay/testdata/base.qcow2": false,
		"../overlay/testdata/raw.img":    false,
	} {
		got, err := relativeBacking(path)
		if err != nil || got != want {
			t.Errorf("relativeBacking(%s) = %v, %v; want %v", path, got, err, want)
		}
	}
}

// TestGrantSearch lets a QEMU running as another user reach a machine's
// directory: vmfork's own directories get search permission for others,
// the directories above the state dir are only checked.
func TestGrantSearch(t *testing.T) {
	const uid, gid = 64055, 64055 // libvirt-qemu on Debian: neither owner nor group here
	root := t.TempDir()
	state := filepath.Join(root, "state")
	dir := filepath.Join(state, "machines", "web")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o700); err != nil {
		t.Fatal(err)
	}
	err := grantSearch(state, uid, gid, dir)
	if err == nil || !strings.Contains(err.Error(), "cannot search "+root) {
		t.Fatalf("grantSearch below an unsearchable directory = %v, want an error naming %s", err, root)
	}
	if mode(t, dir) != 0o700 {
		t.Errorf("a refused grant changed %s", dir)
	}
	// As an operator would have it: /var/lib is searchable by everyone.
	for _, p := range []string{root, filepath.Dir(root)} { // the test's own
		if err := os.Chmod(p, mode(t, p)|0o001); err != nil {
			t.Fatal(err)
		}
	}
	if err := checkReach(state, uid, gid); err != nil {
		t.Skipf("the test's temp dir is out of reach: %v", err)
	}
	if err := grantSearch(state, uid, gid, dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{state, filepath.Join(state, "machines"), dir} {
		if got := mode(t, p); got != 0o701 && got != 0o755 {
			t.Errorf("%s mode %o, want search for others and nothing more", p, got)
		}
	}
	if got := mode(t, dir); got != 0o701 {
		t.Errorf("%s mode %o, want 701", dir, got)
	}
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func sameDevice(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev
}
