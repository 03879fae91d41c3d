//go:build integration

package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLibvirtSession is the libvirt driver with qemu:///session, as an
// ordinary user without the kvm group: the client starts the user's own
// libvirtd --session (Debian 12 ships no virtqemud), which runs QEMU as the
// user. `vmfork libvirt setup` puts the session's guest RAM on a tmpfs; the
// user boots a busybox guest, forks a child that runs on the parent's
// memory (its QEMU maps the template privately), forks the child, saves a
// kept template and forks it, stops and starts the parent, is refused a
// libvirt network in one line, and removes everything. A second
// user's session daemon sees none of the first user's domains. Each daemon
// the test caused is stopped by the PID in its pid file, and its dirs go
// with the user's home, on every path.
func TestLibvirtSession(t *testing.T) {
	parallel(t)
	const uri = "qemu:///session"
	u, other := newUnprivUser(t), newUnprivUser(t)
	runU, runO := sessionRuntimeDir(t, u), sessionRuntimeDir(t, other)
	g := testGuest(t)
	bin := filepath.Join(u.home, "vmfork")
	u.copyFor(t, os.Getenv("VMFORK_BIN"), bin, 0o755)
	for _, p := range []*string{&g.Kernel, &g.Initrd, &g.Disk} {
		dst := filepath.Join(u.home, filepath.Base(*p))
		u.copyFor(t, *p, dst, 0o600)
		*p = dst
	}
	e := newEnvGuest(t, g) // its cleanup kills the domains' QEMUs by PID first
	// Root's setup, as every libvirt test's (with the vmfork under test):
	// it keeps the system's hook directory readable, which each session
	// daemon lists at start, and its hook runs for session domains too.
	libvirtSetup(t, e)
	os.RemoveAll(e.memDir)
	e.bin = bin
	e.stateDir = filepath.Join(u.home, ".local", "state", "vmfork")
	e.memDir = "/dev/shm/vmfork-" + strconv.Itoa(u.uid)
	// The session daemon makes each domain's agent socket under
	// $XDG_CONFIG_HOME/libvirt/qemu/channel/target/domain-ID-NAME/, and
	// refuses a path over the 107 bytes of a unix socket's name: the
	// test's home (/tmp/vmfork-unpriv-home-NNNNNNNNNN) is too long for
	// "grandkid" under ~/.config, a real /home/USER is not.
	cfg, err := os.MkdirTemp("", "lv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(cfg) })
	if err := os.Chown(cfg, u.uid, u.gid); err != nil {
		t.Fatal(err)
	}
	e.runAs = slices.Concat(u.as(), []string{"env", "XDG_RUNTIME_DIR=" + runU, "XDG_CONFIG_HOME=" + cfg})
	lv := func(args ...string) result { return e.vmfork(append([]string{"--connect", uri}, args...)...) }
	lvOK := func(args ...string) result {
		t.Helper()
		r := lv(args...)
		if r.code != 0 {
			t.Fatalf("vmfork --connect %s %s: %s", uri, strings.Join(args, " "), r)
		}
		return r
	}
	// ls through the session daemon too: the records are libvirt's.
	list := func() []machineJSON {
		t.Helper()
		var ms []machineJSON
		if err := json.Unmarshal([]byte(lvOK("ls", "--json").stdout), &ms); err != nil {
			t.Fatalf("ls --json: %v", err)
		}
		return ms
	}

	// Before any daemon runs, so that it starts with the tmpfs.
	lvOK("libvirt", "setup")
	if r := lvOK("libvirt", "check"); !strings.Contains(r.stdout, "host: libvirt can run") {
		t.Errorf("libvirt check on %s after setup: %s", uri, r)
	}
	boot := []string{"boot", "src", "--kernel", g.Kernel, "--initrd", g.Initrd, "--disk", g.Disk, "--memory", "256M"}
	oneLineRefusal(t, lv(append(slices.Clone(boot), "--network", "network=default")...), "needs qemu:///system")
	started := time.Now()
	lvOK(boot...)
	t.Logf("boot under %s: %.1f s", uri, time.Since(started).Seconds())
	if ms := list(); len(ms) != 1 || ms[0].PID <= 0 {
		t.Fatalf("after boot: %+v, want src with its QEMU's pid", ms)
	}
	lvOK("exec", "src", "--", "sh", "-c", "echo from-parent > /tmp/mark")

	var res forkJSON
	e.jsonOK(&res, "--connect", uri, "fork", "src", "kid")
	if len(res.Children) != 1 || res.Children[0].State != "running" || len(res.Failed) != 0 {
		t.Fatalf("fork under %s = %+v, want one running child", uri, res)
	}
	t.Logf("fork under %s as uid %d: pause %.1f ms, child ready in %.0f ms", uri, u.uid, res.PauseMS, res.Children[0].ReadyMS)
	// The child runs on the parent's memory: /tmp is RAM, and its QEMU
	// maps the template's RAM file, which no copy made.
	if got := strings.TrimSpace(lvOK("exec", "kid", "--", "cat", "/tmp/mark").stdout); got != "from-parent" {
		t.Errorf("the child reads %q from the parent's RAM, want from-parent", got)
	}
	kid := machineNamed(t, list(), "kid")
	if kid.PID <= 0 || !mapsFileIn(kid.PID, e.memDir) {
		t.Errorf("the child's QEMU (pid %d) maps no RAM file in %s", kid.PID, e.memDir)
	}
	// A fork of the child needs its RAM file on the templates' file
	// system: what setup's memory_backing_dir is for.
	var res2 forkJSON
	e.jsonOK(&res2, "--connect", uri, "fork", "kid", "grandkid")
	if len(res2.Children) != 1 || res2.Children[0].State != "running" {
		t.Fatalf("fork of the child under %s = %+v", uri, res2)
	}
	t.Logf("fork of the child: pause %.1f ms, ready in %.0f ms", res2.PauseMS, res2.Children[0].ReadyMS)

	// Two users' session daemons are two daemons: the other user's sees
	// none of u's domains.
	if out := sessionVirsh(t, other, runO, "list", "--all", "--name"); strings.TrimSpace(out) != "" {
		t.Errorf("the other user's session lists %q, want none of %s's domains", out, u.name)
	}
	if out := sessionVirsh(t, u, runU, "list", "--name"); !strings.Contains(out, "grandkid") {
		t.Errorf("%s's session lists %q, want its own domains", u.name, out)
	}

	// A kept template, a fork of it, and the source stopped and started
	// again, all through the session daemon.
	started = time.Now()
	var saved templateJSON
	e.jsonOK(&saved, "--connect", uri, "template", "save", "src", "golden")
	if saved.Name != "golden" || !saved.HasMemory {
		t.Fatalf("template save under %s = %+v, want golden with memory", uri, saved)
	}
	e.jsonOK(&res, "--connect", uri, "fork", "golden", "tkid")
	if len(res.Children) != 1 || res.Children[0].State != "running" {
		t.Fatalf("fork of template golden under %s = %+v", uri, res)
	}
	if got := strings.TrimSpace(lvOK("exec", "tkid", "--", "cat", "/tmp/mark").stdout); got != "from-parent" {
		t.Errorf("the template's child reads %q from the saved RAM, want from-parent", got)
	}
	lvOK("stop", "src")
	if m := machineNamed(t, list(), "src"); m.State != "stopped" {
		t.Errorf("after stop under %s: src is %s, want stopped", uri, m.State)
	}
	lvOK("start", "src")
	if m := machineNamed(t, list(), "src"); m.State != "running" || m.PID <= 0 {
		t.Errorf("after start under %s: src = %+v, want running with its QEMU's pid", uri, m)
	}
	lvOK("exec", "src", "--", "true")
	t.Logf("template save, a fork of it, stop and start under %s: %.1f s", uri, time.Since(started).Seconds())

	lvOK("rm", "--force", "tkid", "grandkid", "kid", "src")
	lvOK("template", "rm", "golden")
	if out := sessionVirsh(t, u, runU, "list", "--all", "--name"); strings.TrimSpace(out) != "" {
		t.Errorf("after rm %s's session still lists %q", u.name, out)
	}
	if ms := list(); len(ms) != 0 {
		t.Errorf("after rm: %+v", ms)
	}
	// The release hook's reapers (libvirt runs hooks without
	// XDG_RUNTIME_DIR) reach this daemon: none started a second one.
	time.Sleep(time.Second)
	if extra := strayDaemons(u, runU); len(extra) > 0 {
		t.Errorf("session daemons of %s besides the one in %s: %v", u.name, runU, extra)
	}
}

// strayDaemons lists u's libvirtd processes other than the one whose pid
// file is in runDir.
func strayDaemons(u *unprivUser, runDir string) []string {
	data, _ := os.ReadFile(filepath.Join(runDir, "libvirt", "libvirtd.pid"))
	own := strings.TrimSpace(string(data))
	var out []string
	for _, pid := range u.processes() {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.HasPrefix(filepath.Base(string(cmd)), "libvirtd") && strconv.Itoa(pid) != own {
			out = append(out, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
		}
	}
	return out
}

// sessionRuntimeDir makes u an XDG_RUNTIME_DIR (no systemd user session
// makes one here), and stops the session daemons a client started there by
// the PIDs in their pid files when the test ends.
func sessionRuntimeDir(t *testing.T, u *unprivUser) string {
	t.Helper()
	dir := filepath.Join(u.home, "run")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, u.uid, u.gid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, name := range []string{"libvirtd.pid", "virtlogd.pid"} {
			data, err := os.ReadFile(filepath.Join(dir, "libvirt", name))
			if err != nil {
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			var st syscall.Stat_t
			// The pid file may be stale: only a process of u's.
			if err != nil || pid <= 0 || syscall.Stat(fmt.Sprintf("/proc/%d", pid), &st) != nil || int(st.Uid) != u.uid {
				continue
			}
			syscall.Kill(pid, syscall.SIGTERM)
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil; {
				time.Sleep(50 * time.Millisecond)
			}
			syscall.Kill(pid, syscall.SIGKILL)
		}
		os.RemoveAll(dir)
		os.RemoveAll(fmt.Sprintf("/dev/shm/vmfork-%d-libvirt", u.uid))
	})
	return dir
}

// sessionVirsh runs virsh against u's session daemon.
func sessionVirsh(t *testing.T, u *unprivUser, runDir string, args ...string) string {
	t.Helper()
	argv := slices.Concat(u.as(), []string{"env", "XDG_RUNTIME_DIR=" + runDir, "virsh", "-c", "qemu:///session"}, args)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("virsh %s as %s: %v: %s", strings.Join(args, " "), u.name, err, out)
	}
	return string(out)
}

// machineNamed is name's row of `vmfork ls`.
func machineNamed(t *testing.T, ms []machineJSON, name string) machineJSON {
	t.Helper()
	for _, m := range ms {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("no machine %q in ls", name)
	return machineJSON{}
}

// mapsFileIn reports whether process pid maps a file in dir.
func mapsFileIn(pid int, dir string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	return err == nil && strings.Contains(string(data), " "+filepath.Clean(dir)+"/")
}
