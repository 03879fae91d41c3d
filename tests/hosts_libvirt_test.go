//go:build integration

package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A rig host with a libvirtd of its own (hostRigOptions.libvirtB): a
// second libvirtd on this machine, beside the host's, in a mount namespace
// of its own (docs/TEMPLATES.md, "libvirt's route"). A privileged libvirtd
// takes its state dirs from compiled-in paths (/run/libvirt/qemu,
// /var/lib/libvirt/qemu ...), so the namespace bind-mounts temporary
// directories over them and over /etc/libvirt (an empty libvirtd.conf; a
// qemu.conf that names its own memory_backing_dir) and /var/log/libvirt;
// its virtlogd runs there too (the host's listens on the host's
// /run/libvirt). The namespace is entered from the host's network
// namespace, so the daemon and the QEMUs it starts are in it; the host's
// sshd runs in both namespaces (hostRig.startSSHD through rigHost.enter),
// so that a vmfork run over ssh there reaches that libvirtd at
// qemu:///system, as on a real host.
//
// Not set up there: vmfork's libvirt start hook (`vmfork libvirt setup`
// would signal the libvirtd of /run/libvirtd.pid, the host's: /run is not
// the namespace's own). A child whose RAM arrives by migration needs no
// hook (its RAM is a file of its own); a local fork on that host would.

// rigLibvirtd is a host's own libvirtd.
type rigLibvirtd struct {
	dir    string // its bind-mounted directories, pid files, logs
	memDir string // its memory_backing_dir (on /dev/shm: a tmpfs)
	holder *exec.Cmd
}

// startLibvirtd starts h's libvirtd and virtlogd in a mount namespace
// held by a process of the rig's (sleep), entered from h's network
// namespace, and sets h.enter to run commands in both. The daemons, the
// domains they run, the holder and the directories are removed when the
// test ends, pass or fail, each by PID.
func (r *hostRig) startLibvirtd(h *rigHost) {
	t := r.t
	t.Helper()
	lv := &rigLibvirtd{dir: filepath.Join(h.dir, "libvirt"), memDir: "/dev/shm/vmfork-rig-" + filepath.Base(h.ns)}
	binds := map[string]string{
		"run": "/run/libvirt", "lib": "/var/lib/libvirt", "cache": "/var/cache/libvirt",
		"etc": "/etc/libvirt", "log": "/var/log/libvirt",
	}
	for d := range binds {
		if err := os.MkdirAll(filepath.Join(lv.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// QEMU runs as libvirt's user: it must search the mem dir.
	if err := os.MkdirAll(lv.memDir, 0o755); err != nil {
		t.Fatal(err)
	}
	etc := filepath.Join(lv.dir, "etc")
	for name, text := range map[string]string{
		"libvirtd.conf": "",
		"virtlogd.conf": "",
		"qemu.conf":     fmt.Sprintf("memory_backing_dir = %q\n", lv.memDir),
	} {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var script strings.Builder
	script.WriteString("set -e\nmount --make-rprivate /\n")
	for d, target := range binds {
		fmt.Fprintf(&script, "mount --bind %s %s\n", filepath.Join(lv.dir, d), target)
	}
	fmt.Fprintf(&script, "virtlogd -d -p %s\n", filepath.Join(lv.dir, "virtlogd.pid"))
	fmt.Fprintf(&script, "libvirtd -d -p %s\n", filepath.Join(lv.dir, "libvirtd.pid"))
	script.WriteString("exec sleep infinity\n")
	log, err := os.Create(filepath.Join(lv.dir, "holder.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command("ip", "netns", "exec", h.ns, "unshare", "-m", "--propagation", "private", "sh", "-c", script.String())
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("host %s: start its libvirtd: %v", h.name, err)
	}
	lv.holder, h.libvirt = cmd, lv
	// ip netns exec and unshare exec: the holder's PID is the shell's,
	// then sleep's, inside both namespaces.
	h.enter = []string{"nsenter", "-t", strconv.Itoa(cmd.Process.Pid), "-m", "-n", "--"}
	t.Cleanup(func() { r.stopLibvirtd(h) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := h.virsh("version")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			hl, _ := os.ReadFile(log.Name())
			t.Fatalf("host %s: its libvirtd does not answer: %v: %s; holder: %s", h.name, err, out, hl)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// virsh runs virsh against h's own libvirtd.
func (h *rigHost) virsh(args ...string) (string, error) {
	argv := append(append(append([]string{}, h.enter...), "virsh", "-c", "qemu:///system"), args...)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}

// domains lists h's own libvirtd's domains.
func (h *rigHost) domains() []string {
	out, err := h.virsh("list", "--all", "--name")
	if err != nil {
		h.t.Errorf("host %s: virsh list: %v: %s", h.name, err, out)
		return nil
	}
	return strings.Fields(out)
}

// stopLibvirtd destroys h's libvirtd's domains, stops it and its virtlogd
// and the holder by PID, and removes their directories.
func (r *hostRig) stopLibvirtd(h *rigHost) {
	t, lv := r.t, h.libvirt
	for _, n := range h.domains() {
		if out, err := h.virsh("destroy", n); err != nil {
			t.Errorf("host %s: destroy domain %s: %v: %s", h.name, n, err, out)
		}
	}
	for _, name := range []string{"libvirtd.pid", "virtlogd.pid"} {
		data, err := os.ReadFile(filepath.Join(lv.dir, name))
		if err != nil {
			t.Errorf("host %s: %v", h.name, err)
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 1 {
			t.Errorf("host %s: %s holds %q", h.name, name, data)
			continue
		}
		syscall.Kill(pid, syscall.SIGTERM)
		for deadline := time.Now().Add(15 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("host %s: %s %d did not end on SIGTERM: killed", h.name, name, pid)
				syscall.Kill(pid, syscall.SIGKILL)
				break
			}
		}
	}
	syscall.Kill(-lv.holder.Process.Pid, syscall.SIGKILL)
	lv.holder.Wait()
	if t.Failed() {
		for _, f := range []string{"holder.log", "log/libvirtd.log"} {
			if out, err := os.ReadFile(filepath.Join(lv.dir, f)); err == nil {
				t.Logf("host %s: %s:\n%s", h.name, f, tail(string(out), 20))
			}
		}
	}
	if err := os.RemoveAll(lv.memDir); err != nil {
		t.Errorf("host %s: %v", h.name, err)
	}
}
