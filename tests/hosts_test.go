//go:build integration

package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A rig of "hosts" on this machine (issue 24, item 4): each host is a
// network namespace with its own sshd (key auth only, with a key the test
// makes), its own state dir and mem dir; the namespaces are joined by a
// veth pair and by nothing else, so the SSH traffic between hosts stays
// between them. Every vmfork a host runs runs inside its namespace (env.runAs),
// and its sshd gives its sessions that host's dirs (sshd_config SetEnv), as
// a real host's defaults would.
//
// What is simulated and what is not (docs/TEMPLATES.md, "Testing more than
// one host"): one kernel, one QEMU build, one file system and one page
// cache; the hosts differ in network stack, sshd, state and mem dir. A
// host with another QEMU is simulated by a wrapper that reports another
// version.

// rigHost is one simulated host.
type rigHost struct {
	*env
	name string
	ns   string
	addr string // its address on the veth link
	dir  string // its sshd's files
	// sshEnv is more NAME=VALUE for its sshd's SetEnv (newHostRig's
	// hostEnv), e.g. VMFORK_OVERCOMMIT to give the hosts unequal room.
	sshEnv string
	// enter, when set, runs a command in the host's namespaces instead of
	// ip netns exec: a host with a libvirtd of its own
	// (hosts_libvirt_test.go) has a mount namespace too.
	enter []string
	// libvirt is its own libvirtd's, nil for a host without one.
	libvirt *rigLibvirtd
}

// hostRigOptions change what newHostRigWith makes; the zero value is
// newHostRig's rig.
type hostRigOptions struct {
	// libvirtB gives host b a libvirtd of its own (hosts_libvirt_test.go);
	// host a uses this machine's.
	libvirtB bool
}

// hostRig is two hosts and what their sessions need.
type hostRig struct {
	t     testing.TB
	dir   string
	key   string // the client key, authorized on every host
	sshCF string // an ssh_config: the key, known_hosts, no prompts
	hosts []*rigHost
}

// newHostRig makes two hosts, A (10.233.0.1) and B (10.233.0.2), and
// removes them when the test ends, pass or fail: the namespaces are made
// first, so their removal runs last, after the hosts' QEMUs and sshds are
// gone (t.Cleanup runs last-in first-out). hostEnv[i], when given, is
// more NAME=VALUE (space-separated) for host i's sessions.
func newHostRig(t testing.TB, hostEnv ...string) *hostRig {
	t.Helper()
	return newHostRigWith(t, hostRigOptions{}, hostEnv...)
}

// newHostRigWith is newHostRig with options.
func newHostRigWith(t testing.TB, opts hostRigOptions, hostEnv ...string) *hostRig {
	t.Helper()
	sum := sha256.Sum256([]byte(t.Name() + t.TempDir()))
	id := hex.EncodeToString(sum[:3])
	r := &hostRig{t: t, dir: t.TempDir()}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// sshd's privilege-separation directory: the openssh-server package's,
	// made at boot by its service, which this machine does not run. Left in
	// place: other sshds need it, and it is empty.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	r.key = filepath.Join(r.dir, "id")
	run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vmfork-test", "-f", r.key)
	pub, err := os.ReadFile(r.key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "authorized_keys"), pub, 0o600); err != nil {
		t.Fatal(err)
	}
	var known strings.Builder
	for i, name := range []string{"a", "b"} {
		h := &rigHost{name: name, ns: fmt.Sprintf("vmfh-%s-%s", id, name), addr: fmt.Sprintf("10.233.0.%d", i+1), dir: filepath.Join(r.dir, name)}
		run("ip", "netns", "add", h.ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", h.ns).CombinedOutput(); err != nil {
				t.Errorf("remove namespace %s: %v: %s", h.ns, err, out)
			}
		})
		run("ip", "-n", h.ns, "link", "set", "lo", "up")
		if err := os.Mkdir(h.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(h.dir, "hostkey"))
		hk, err := os.ReadFile(filepath.Join(h.dir, "hostkey.pub"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&known, "%s %s", h.addr, hk)
		r.hosts = append(r.hosts, h)
	}
	a, b := r.hosts[0], r.hosts[1]
	va, vb := "vfh"+id+"a", "vfh"+id+"b"
	run("ip", "link", "add", va, "netns", a.ns, "type", "veth", "peer", "name", vb, "netns", b.ns)
	for _, x := range []struct {
		h   *rigHost
		dev string
	}{{a, va}, {b, vb}} {
		run("ip", "-n", x.h.ns, "addr", "add", x.h.addr+"/24", "dev", x.dev)
		run("ip", "-n", x.h.ns, "link", "set", x.dev, "up")
	}
	if err := os.WriteFile(filepath.Join(r.dir, "known_hosts"), []byte(known.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	r.sshCF = filepath.Join(r.dir, "ssh_config")
	cf := fmt.Sprintf(`Host *
  User root
  IdentityFile %s
  IdentitiesOnly yes
  UserKnownHostsFile %s
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  LogLevel ERROR
`, r.key, filepath.Join(r.dir, "known_hosts"))
	if err := os.WriteFile(r.sshCF, []byte(cf), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, h := range r.hosts {
		if i < len(hostEnv) {
			h.sshEnv = hostEnv[i]
		}
		h.enter = []string{"ip", "netns", "exec", h.ns}
		if opts.libvirtB && i == 1 {
			// Before the env: its cleanup (the QEMUs, the dirs) runs
			// first, the daemon's after.
			r.startLibvirtd(h)
		}
		h.env = newEnv(t)
		h.env.runAs = h.enter
		r.startSSHD(h)
	}
	return r
}

// startSSHD starts h's sshd in h's namespace, stopped by PID (its
// process group: the sessions it forked too) when the test ends.
func (r *hostRig) startSSHD(h *rigHost) {
	t := r.t
	t.Helper()
	conf := filepath.Join(h.dir, "sshd_config")
	cf := fmt.Sprintf(`ListenAddress %s
Port 22
HostKey %s
AuthorizedKeysFile %s
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PidFile none
LogLevel ERROR
Subsystem sftp /usr/lib/openssh/sftp-server
SetEnv VMFORK_STATE_DIR=%s VMFORK_MEM_DIR=%s %s
`, h.addr, filepath.Join(h.dir, "hostkey"), filepath.Join(r.dir, "authorized_keys"), h.stateDir, h.memDir, h.sshEnv)
	if err := os.WriteFile(conf, []byte(cf), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(h.dir, "sshd.log"))
	if err != nil {
		t.Fatal(err)
	}
	// ip netns exec and nsenter exec sshd: the PID is sshd's.
	cmd := exec.Command(h.enter[0], append(h.enter[1:], "/usr/sbin/sshd", "-D", "-e", "-f", conf)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sshd of host %s: %v", h.name, err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		cmd.Wait()
		log.Close()
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("sshd of host %s:\n%s", h.name, tail(string(out), 20))
		}
	})
	// Ready when a session from the host itself runs.
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := exec.Command(h.enter[0], append(h.enter[1:], "ssh", "-F", r.sshCF, "-o", "BatchMode=yes", h.addr, "true")...).CombinedOutput()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd of host %s does not answer: %v: %s", h.name, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// transfer returns the flags a push or pull from h needs: the rig's ssh
// config, and the path of vmfork on the other host (the same build).
func (r *hostRig) transfer(remoteEnv ...string) []string {
	remote := strings.Join(append(remoteEnv, r.hosts[0].bin), " ")
	return []string{"--ssh", "ssh -F " + r.sshCF, "--remote-vmfork", remote, "--idle-timeout", "60s"}
}

// chunkFiles lists the chunks in h's store.
func (h *rigHost) chunkFiles() []string {
	found, _ := filepath.Glob(filepath.Join(h.stateDir, "chunks", "*", "*"))
	var ds []string
	for _, f := range found {
		if len(filepath.Base(f)) == 64 {
			ds = append(ds, filepath.Base(f))
		}
	}
	return ds
}
