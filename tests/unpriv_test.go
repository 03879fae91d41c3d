//go:build integration

package tests

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// unprivUser is a throwaway system user, removed when the test ends.
type unprivUser struct {
	name     string
	uid, gid int
	home     string
}

// newUnprivUser creates a user with a home of its own (in /tmp) and removes
// both when the test ends, after killing every process left running as it.
// Cleanups run last-in first-out: register this before the env, whose
// cleanup kills its QEMUs by PID first.
func newUnprivUser(t *testing.T) *unprivUser {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test creates a user: run the integration tests as root, as CI does")
	}
	home, err := os.MkdirTemp("", "vmfork-unpriv-home-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	b := make([]byte, 4)
	rand.Read(b)
	name := "vmft" + hex.EncodeToString(b)
	if out, err := exec.Command("useradd", "--system", "--user-group", "--no-create-home",
		"--home-dir", home, "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	u := &unprivUser{name: name, home: home}
	t.Cleanup(func() { u.remove(t) })
	pw, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	u.uid, _ = strconv.Atoi(pw.Uid)
	u.gid, _ = strconv.Atoi(pw.Gid)
	if err := os.Chown(home, u.uid, u.gid); err != nil {
		t.Fatal(err)
	}
	return u
}

// remove kills what still runs as the user (by PID, each checked to be the
// user's) and deletes the user and its group.
func (u *unprivUser) remove(t *testing.T) {
	// uid 0: the user was made but not looked up; nothing ran as it, and
	// root's processes are not its.
	if u.uid > 0 {
		for _, pid := range u.processes() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		for deadline := time.Now().Add(10 * time.Second); len(u.processes()) > 0 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		// What a vmfork of the user's made with its defaults outside
		// its home (OpenStore makes the default mem dir even for `ls`).
		mem := "/dev/shm/vmfork-" + strconv.Itoa(u.uid)
		for _, d := range []string{mem, mem + "-ledger", mem + "-libvirt"} {
			os.RemoveAll(d)
		}
	}
	if out, err := exec.Command("userdel", u.name).CombinedOutput(); err != nil {
		t.Errorf("userdel %s: %v: %s", u.name, err, out)
	}
}

// processes lists the live processes running as the user.
func (u *unprivUser) processes() []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+e.Name(), &st) == nil && int(st.Uid) == u.uid {
			if status, err := os.ReadFile("/proc/" + e.Name() + "/status"); err == nil && !bytes.Contains(status, []byte("State:\tZ")) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// as is the command prefix that runs argv as the user, with the environment
// a login would give it (HOME, USER, PATH) and no capabilities.
func (u *unprivUser) as() []string {
	return []string{"setpriv", "--reuid=" + strconv.Itoa(u.uid), "--regid=" + strconv.Itoa(u.gid),
		"--clear-groups", "--reset-env", "--"}
}

// copyFor copies src to dst, owned by the user, mode perm.
func (u *unprivUser) copyFor(t *testing.T, src, dst string, perm os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dst, u.uid, u.gid); err != nil {
		t.Fatal(err)
	}
}

// privateTo fails the test unless path belongs to uid and neither its group
// nor others may read, write or search it.
func privateTo(t *testing.T, path string, uid int) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if int(st.Uid) != uid || st.Mode&0o077 != 0 {
		t.Errorf("%s: uid %d, mode %04o; want uid %d and nothing for group or others", path, st.Uid, st.Mode&0o7777, uid)
	}
}

// systemBridgeHelper is where Debian's qemu-system-common installs the
// helper, without its setuid bit.
const systemBridgeHelper = "/usr/lib/qemu/qemu-bridge-helper"

// bridgeHelpers copies the system's qemu-bridge-helper twice into a
// directory of root's: setuid root, as a host set up for unprivileged
// bridges has it, and plain, as Debian installs it. The system's own file
// is left as it is; the copies go when the test ends.
func bridgeHelpers(t *testing.T) (setuid, plain string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "vmfork-bridge-helper-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	setuid, plain = filepath.Join(dir, "qemu-bridge-helper"), filepath.Join(dir, "plain-bridge-helper")
	for _, p := range []string{setuid, plain} {
		copyFile(t, systemBridgeHelper, p, 0o755)
	}
	if err := os.Chmod(setuid, os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	return setuid, plain
}

func copyFile(t *testing.T, src, dst string, perm os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("%v (qemu-system-common installs it: make deps)", err)
	}
	if err := os.WriteFile(dst, data, perm); err != nil {
		t.Fatal(err)
	}
}

// bridgeConf is qemu-bridge-helper's allow list (compiled into it).
const bridgeConf = "/etc/qemu/bridge.conf"

// allowBridge adds "allow BRIDGE" to the helper's allow list for the
// test, making the file (and /etc/qemu) where there is none, and takes
// both back when the test ends.
func allowBridge(t *testing.T, bridge string) {
	t.Helper()
	dir := filepath.Dir(bridgeConf)
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(dir) })
	}
	line := "allow " + bridge + "\n"
	_, err := os.Stat(bridgeConf)
	existed := err == nil
	t.Cleanup(func() {
		if !existed {
			if err := os.Remove(bridgeConf); err != nil {
				t.Errorf("remove %s: %v", bridgeConf, err)
			}
			return
		}
		data, err := os.ReadFile(bridgeConf)
		if err == nil {
			err = os.WriteFile(bridgeConf, []byte(strings.Replace(string(data), line, "", 1)), 0o644)
		}
		if err != nil {
			t.Errorf("take %q out of %s: %v", line, bridgeConf, err)
		}
	})
	f, err := os.OpenFile(bridgeConf, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = f.WriteString(line)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// yamaScope is Yama's ptrace policy, absent where the kernel has no Yama.
const yamaScope = "/proc/sys/kernel/yama/ptrace_scope"

// yama1 sets Yama's ptrace_scope to 1 (Ubuntu's and Fedora's default) for
// the test and restores it after; without Yama it says so and changes
// nothing.
func yama1(t *testing.T) {
	t.Helper()
	old, err := os.ReadFile(yamaScope)
	if err != nil {
		t.Logf("no Yama on this kernel (%v): ptrace_scope 1 is not exercised", err)
		return
	}
	if err := os.WriteFile(yamaScope, []byte("1\n"), 0o644); err != nil {
		t.Fatalf("set %s to 1: %v", yamaScope, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(yamaScope, old, 0o644); err != nil {
			t.Errorf("restore %s to %s: %v", yamaScope, strings.TrimSpace(string(old)), err)
		}
	})
}

// tunMode sets the tun device's mode for the test; the first call records
// the host's, which is restored when the test ends.
func tunMode(t *testing.T, mode os.FileMode) {
	t.Helper()
	const tun = "/dev/net/tun"
	if _, ok := tunModes.LoadOrStore(t, true); !ok {
		st, err := os.Stat(tun)
		if err != nil {
			t.Fatal(err)
		}
		old := st.Mode().Perm()
		t.Cleanup(func() {
			tunModes.Delete(t)
			if err := os.Chmod(tun, old); err != nil {
				t.Errorf("restore %s to %04o: %v", tun, old, err)
			}
		})
	}
	if err := os.Chmod(tun, mode); err != nil {
		t.Fatal(err)
	}
}

// tunModes: the tests that changed the tun device's mode.
var tunModes sync.Map
