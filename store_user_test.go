package vmfork

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Each user gets state and RAM directories of its own by default: two
// users never share a mem dir in /dev/shm.
func TestDefaultDirsPerUser(t *testing.T) {
	for _, c := range []struct {
		uid             int
		xdg, home, want string
	}{
		{0, "/x", "/root", "/var/lib/vmfork"},
		{1000, "", "/home/a", "/home/a/.local/state/vmfork"},
		{1000, "/home/a/st", "/home/a", "/home/a/st/vmfork"},
	} {
		if got := defaultStateDir(c.uid, c.xdg, c.home); got != c.want {
			t.Errorf("defaultStateDir(%d, %q, %q) = %q, want %q", c.uid, c.xdg, c.home, got, c.want)
		}
	}
	if got := defaultMemDir(0); got != "/dev/shm/vmfork" {
		t.Errorf("root's mem dir = %q", got)
	}
	if a, b := defaultMemDir(1000), defaultMemDir(1001); a != "/dev/shm/vmfork-1000" || a == b {
		t.Errorf("mem dirs of uid 1000 and 1001 = %q, %q; want /dev/shm/vmfork-UID each", a, b)
	}
}

// A fresh store is for its user alone: the state dir, its subdirectories
// and the mem dir are 0700 (vmfork runs under umask 077, so RAM files QEMU
// creates there are 0600).
func TestOpenStoreFreshDirsAre0700(t *testing.T) {
	root := t.TempDir()
	state, mem := filepath.Join(root, "a", "state"), filepath.Join(root, "b", "mem")
	s, err := OpenStore(state, mem)
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{s.StateDir, s.MemDir}
	for _, sub := range []string{dirMachines, dirTemplates, dirJournal, dirLocks, dirPool} {
		dirs = append(dirs, filepath.Join(s.StateDir, sub))
	}
	for _, d := range dirs {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if perm := st.Mode().Perm(); perm != 0o700 {
			t.Errorf("%s is %04o, want 0700", d, perm)
		}
	}
}

// A state or mem dir another user owns is refused in one line that names
// it and the way out: in /dev/shm anyone may create /dev/shm/vmfork-UID
// first.
func TestOpenStoreRefusesAnotherUsersDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory to another user") // CI runs unit tests as root
	}
	const nobody = 65534
	for _, which := range []string{"state", "mem"} {
		t.Run(which, func(t *testing.T) {
			root := t.TempDir()
			state, mem := filepath.Join(root, "state"), filepath.Join(root, "mem")
			if _, err := OpenStore(state, mem); err != nil {
				t.Fatal(err)
			}
			theirs := map[string]string{"state": state, "mem": mem}[which]
			if err := os.Chown(theirs, nobody, nobody); err != nil {
				t.Fatal(err)
			}
			_, err := OpenStore(state, mem)
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), theirs+" belongs to uid 65534") ||
				!strings.Contains(err.Error(), "--mem-dir") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("OpenStore with %s owned by nobody = %v; want one line naming it and --state-dir/--mem-dir", which, err)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(theirs, &st); err != nil || st.Uid != nobody {
				t.Fatalf("OpenStore changed the other user's %s (uid %d, %v)", theirs, st.Uid, err)
			}
		})
	}
}
