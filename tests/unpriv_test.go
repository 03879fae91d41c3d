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
	for _, pid := range u.processes() {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); len(u.processes()) > 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
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

// TestUnprivilegedFork: an ordinary user, without capabilities or the kvm
// group (so under TCG), boots a machine and forks it with its own default
// state and mem dirs; what it makes is its alone, and neither it nor root
// can run vmfork on the other's store.
func TestUnprivilegedFork(t *testing.T) {
	parallel(t)
	u := newUnprivUser(t)
	// The binary and the guest where the user may read them: the test's
	// own copies, since the build tree or the guest cache may be closed.
	g := testGuest(t)
	bin := filepath.Join(u.home, "vmfork")
	u.copyFor(t, os.Getenv("VMFORK_BIN"), bin, 0o755)
	for _, p := range []*string{&g.Kernel, &g.Initrd, &g.Disk} {
		dst := filepath.Join(u.home, filepath.Base(*p))
		u.copyFor(t, *p, dst, 0o600)
		*p = dst
	}
	e := newEnvGuest(t, g)
	os.RemoveAll(e.memDir)
	// The user's defaults; passed explicitly as well, for the harness.
	e.bin, e.runAs = bin, u.as()
	e.stateDir = filepath.Join(u.home, ".local", "state", "vmfork")
	e.memDir = "/dev/shm/vmfork-" + strconv.Itoa(u.uid)

	e.boot("src")
	var res forkJSON
	e.jsonOK(&res, "fork", "src")
	if len(res.Children) != 1 || res.Children[0].State != "running" || len(res.Failed) != 0 {
		t.Fatalf("fork as uid %d = %+v, want one running child", u.uid, res)
	}
	child := res.Children[0].Name
	if got := strings.TrimSpace(e.exec(child, "sh", "-c", "echo alive")); got != "alive" {
		t.Fatalf("child %s answers %q", child, got)
	}
	// A child maps its template privately: forking it takes the Diff
	// path (its frozen file copied, its own pages read from its page map
	// and with process_vm_readv), all of it open to the same user.
	var res2 forkJSON
	e.jsonOK(&res2, "fork", child)
	if len(res2.Children) != 1 || res2.Children[0].State != "running" || len(res2.Failed) != 0 {
		t.Fatalf("fork of child %s as uid %d = %+v, want one running child", child, u.uid, res2)
	}
	if got := strings.TrimSpace(e.exec(res2.Children[0].Name, "sh", "-c", "echo alive")); got != "alive" {
		t.Fatalf("grandchild %s answers %q", res2.Children[0].Name, got)
	}
	// The defaults are the same store: `ls` without dir flags sees both.
	cmd := exec.Command(u.as()[0], append(u.as()[1:], bin, "ls")...)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), child) {
		t.Fatalf("vmfork ls as the user with default dirs: %v: %s", err, out)
	}

	// Everything vmfork and QEMU made is the user's alone.
	privateTo(t, e.stateDir, u.uid)
	privateTo(t, e.memDir, u.uid)
	rams, _ := filepath.Glob(filepath.Join(e.memDir, "*"))
	if len(rams) < 4 {
		// A child has a file of its own once it is forked (the copy
		// its Diff freeze made); until then it maps its template.
		t.Fatalf("RAM files %v: want those of the source, the forked child and two templates", rams)
	}
	for _, p := range append(rams, filepath.Join(e.stateDir, "machines", child)) {
		privateTo(t, p, u.uid)
	}
	// Another user (nobody) cannot open the RAM files.
	nobody := []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "head", "-c1"}
	if out, err := exec.Command(nobody[0], append(nobody[1:], rams[0])...).CombinedOutput(); err == nil {
		t.Errorf("nobody read %s: %s", rams[0], out)
	}
	// Root's vmfork refuses the user's store, and the user's refuses one
	// root owns, in one line each.
	r := exec.Command(os.Getenv("VMFORK_BIN"), "--state-dir", e.stateDir, "--mem-dir", e.memDir, "ls")
	if out, err := r.CombinedOutput(); err == nil || !strings.Contains(string(out), "belongs to uid "+strconv.Itoa(u.uid)) {
		t.Errorf("root's vmfork on the user's store: %v: %s; want it refused", err, out)
	}
	rootStore, err := os.MkdirTemp("", "vmfork-rootstore-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rootStore) })
	os.Chmod(rootStore, 0o755) // the user may look, not write
	rootState, rootMem := filepath.Join(rootStore, "state"), filepath.Join(rootStore, "mem")
	for _, d := range []string{rootState, rootMem} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd = exec.Command(u.as()[0], append(u.as()[1:], bin, "--state-dir", rootState, "--mem-dir", rootMem, "ls")...)
	if out, err := cmd.CombinedOutput(); err == nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("the user's vmfork on root's store: %v: %s; want one line refusing it", err, out)
	}
}
