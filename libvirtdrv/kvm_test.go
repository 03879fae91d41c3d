package libvirtdrv

import (
	"io/fs"
	"os"
	osuser "os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestCanReadWrite(t *testing.T) {
	const owner, group = 0, 107 // root:kvm
	for _, c := range []struct {
		perm fs.FileMode
		uid  int
		gids []int
		want bool
	}{
		{0o600, 64055, []int{107, 64055}, false}, // the fresh host: root:root 0600
		{0o660, 64055, []int{107, 64055}, true},  // what udev does
		{0o660, 64055, []int{64055}, false},      // not in kvm
		{0o666, 64055, []int{64055}, true},       // world-writable
		{0o600, 0, nil, true},                    // root passes
		{0o604, 64055, []int{107}, false},        // the group bits decide for a member
	} {
		if got := canReadWrite(c.perm, owner, group, c.uid, c.gids); got != c.want {
			t.Errorf("canReadWrite(%04o, uid %d, gids %v) = %v, want %v", uint32(c.perm), c.uid, c.gids, got, c.want)
		}
	}
}

func TestQEMUUser(t *testing.T) {
	dir := t.TempDir()
	if got, err := qemuUser(filepath.Join(dir, "missing.conf")); err != nil || got != defaultQEMUUser {
		t.Errorf("qemuUser(no file) = %q, %v; want %q", got, err, defaultQEMUUser)
	}
	conf := filepath.Join(dir, "qemu.conf")
	os.WriteFile(conf, []byte("#user = \"root\"\nuser = \"+0\"\nuser = \"qemu\" # last wins\n"), 0o644)
	if got, err := qemuUser(conf); err != nil || got != "qemu" {
		t.Errorf("qemuUser = %q, %v; want qemu", got, err)
	}
}

// TestKVMAccess runs the fix on a stand-in file: it must report the problem
// for a user outside the device's group, fix it as udev would, and then
// report nothing and change nothing.
func TestKVMAccess(t *testing.T) {
	kvm, err := osuser.LookupGroup("kvm")
	if err != nil || os.Geteuid() != 0 {
		t.Fatalf("this test gives a file to group kvm: it needs root and the kvm group (make deps installs libvirt, which makes it): %v", err)
	}
	nobody, err := osuser.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	dev := filepath.Join(dir, "kvm")
	if err := os.WriteFile(dev, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dev, 0o600)
	conf := filepath.Join(dir, "qemu.conf")
	os.WriteFile(conf, []byte("user = \"+"+nobody.Uid+"\"\n"), 0o644)

	p, err := KVMProblem(dev, conf)
	if err != nil || !strings.Contains(p, "cannot open "+dev) || !strings.Contains(p, "0600") {
		t.Fatalf("KVMProblem before = %q, %v; want the one-line problem", p, err)
	}
	change, err := EnsureKVMAccess(dev, true)
	if err != nil || change == "" {
		t.Fatalf("dry run = %q, %v; want a change described", change, err)
	}
	if st, _ := os.Stat(dev); st.Mode().Perm() != 0o600 {
		t.Fatalf("dry run changed the mode to %v", st.Mode())
	}
	change, err = EnsureKVMAccess(dev, false)
	if err != nil || !strings.Contains(change, "group kvm and mode 0660") {
		t.Fatalf("EnsureKVMAccess = %q, %v", change, err)
	}
	st, _ := os.Stat(dev)
	if gid := st.Sys().(*syscall.Stat_t).Gid; strconv.Itoa(int(gid)) != kvm.Gid || st.Mode().Perm() != 0o660 {
		t.Errorf("after the fix: gid %d mode %v, want kvm (%s) 0660", gid, st.Mode().Perm(), kvm.Gid)
	}
	if change, err := EnsureKVMAccess(dev, false); err != nil || change != "" {
		t.Errorf("second run = %q, %v; want no change", change, err)
	}
	// nobody is not in group kvm: the fix that udev makes does not help it,
	// and the check must still say so.
	if p, err := KVMProblem(dev, conf); err != nil || p == "" {
		t.Errorf("KVMProblem for a user outside kvm = %q, %v; want a problem", p, err)
	}
	if p, err := KVMProblem(filepath.Join(dir, "absent"), conf); err != nil || p != "" {
		t.Errorf("KVMProblem(no device) = %q, %v; want none", p, err)
	}
}
