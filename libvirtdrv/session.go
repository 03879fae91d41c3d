package libvirtdrv

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vmfork/vmfork"
)

// Session mode: qemu:///session is a libvirt daemon of the user's own
// (libvirtd --session on Debian 12, which ships no virtqemud), started by
// the client on first use and gone after two idle minutes. It runs QEMU as
// that user, with no capabilities. What vmfork does differently there:
//
//   - no DAC <seclabel>: the session daemon has no DAC security driver
//     ("Security driver model 'dac' is not available") and QEMU is the
//     user's already, like vmfork's state and mem dirs;
//   - its pid files and logs are under $XDG_RUNTIME_DIR/libvirt and
//     ~/.cache/libvirt, not /run/libvirt and /var/log/libvirt;
//   - libvirt networks and nwfilter need the system daemon: the session's
//     network driver cannot make bridges, dnsmasq or firewall rules, and it
//     has no nwfilter driver. A bridge (bridge=BR) is joined through
//     qemu-bridge-helper by libvirt itself, as with the embedded driver;
//   - `vmfork libvirt setup` installs no hook (children map the template
//     through the in-place remap; no start hook links anything) and touches
//     no /dev/kvm (the user's business: group kvm). It only points the
//     session's memory_backing_dir, ~/.config/libvirt/qemu/ram by default,
//     on disk, at a tmpfs directory of the user's (SessionSetup): a fork of
//     a fork child needs the child's RAM file and the templates on one file
//     system.

// IsLocalSession reports whether uri names the calling user's own session
// daemon on this host.
func IsLocalSession(uri string) bool { return isLocalSession(uri) }

func isLocalSession(uri string) bool {
	return uri == "qemu:///session" || strings.HasPrefix(uri, "qemu:///session?")
}

// sessionRunDir is where the user's session daemon keeps its runtime files:
// $XDG_RUNTIME_DIR/libvirt, or ~/.cache/libvirt without it (libvirt's own
// rule, virGetUserRuntimeDirectory).
func sessionRunDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "libvirt")
	}
	return filepath.Join(sessionCacheDir(), "libvirt")
}

// sessionCacheDir is $XDG_CACHE_HOME or ~/.cache.
func sessionCacheDir() string {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache")
}

// sessionPIDFile and sessionLog are the session daemon's pid file and QEMU
// log of domain name.
func sessionPIDFile(name string) string {
	return filepath.Join(sessionRunDir(), "qemu", "run", name+".pid")
}

func sessionLog(name string) string {
	return filepath.Join(sessionCacheDir(), "libvirt", "qemu", "log", name+".log")
}

// reapURI is the URI the release hook's reaper connects to. libvirt runs
// hooks with HOME and PATH but without XDG_RUNTIME_DIR, so a reaper given
// plain qemu:///session would start a second session daemon of the user's
// (its sockets under ~/.cache), which knows none of the domains and
// outlives the test by two minutes: it is given the running daemon's socket.
func reapURI(uri string) string {
	if uri != "qemu:///session" {
		return uri
	}
	return uri + "?socket=" + filepath.Join(sessionRunDir(), "libvirt-sock")
}

// readPID reads a pid file; 0 when there is none.
func readPID(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

// sessionStartProblem says why the client could not start the user's
// session daemon, where vmfork can tell: libvirtd --session exits at once
// when it cannot list the system's hook directory, and the client then
// only says that the socket does not exist. "" when none is known.
func sessionStartProblem(uri string) string {
	if !isLocalSession(uri) {
		return ""
	}
	if _, err := os.ReadDir(DefaultHookDir); errors.Is(err, fs.ErrPermission) {
		return fmt.Sprintf("the session daemon cannot read %s and exits: `chmod 755 %s` as root, or run `vmfork libvirt setup` as root", DefaultHookDir, DefaultHookDir)
	}
	return ""
}

// checkSessionNetwork refuses, in session mode, a network that only the
// system daemon can provide.
func checkSessionNetwork(uri string, m *vmfork.Machine, n vmfork.Network) error {
	if !isLocalSession(uri) {
		return nil
	}
	if n.Effective().Kind == vmfork.NetworkLibvirt {
		return fmt.Errorf("machine %q: libvirt network %q needs qemu:///system: a %s daemon runs as you and cannot make its bridge, dnsmasq or firewall rules; use --network bridge=BR (joined through qemu-bridge-helper) or user: %w",
			m.Name, n.Name, uri, vmfork.ErrUnsupported)
	}
	return nil
}

// checkSessionContract refuses, in session mode, a contract with network
// rules: vmfork enforces them with libvirt's nwfilter, which only the system
// daemon has.
func checkSessionContract(uri string, m *vmfork.Machine) error {
	if isLocalSession(uri) && m.Contract != nil && m.Contract.Network != nil {
		return fmt.Errorf("machine %q: a contract's network rules need libvirt's nwfilter, which only qemu:///system has (not %s): %w", m.Name, uri, vmfork.ErrUnsupported)
	}
	return nil
}

// SessionQEMUConf is the session daemon's qemu.conf:
// $XDG_CONFIG_HOME/libvirt/qemu.conf, or ~/.config/libvirt/qemu.conf.
func SessionQEMUConf() string {
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "libvirt", "qemu.conf")
}

// SessionMemoryBackingDir is the tmpfs directory SessionSetup gives the
// user's session daemon: beside vmfork's default mem dir
// (/dev/shm/vmfork-UID), so the first fork links the source's RAM file
// instead of copying it, and private to the user like it.
func SessionMemoryBackingDir() string {
	return fmt.Sprintf("/dev/shm/vmfork-%d-libvirt", os.Geteuid())
}

// SessionSetup points the session daemon's memory_backing_dir at dir (a
// tmpfs) in qemuConf, making both when missing; idempotent. The daemon reads
// qemu.conf when it starts: one already running (it exits two minutes after
// its last client and domain) keeps the old value until then, which the
// result says.
func SessionSetup(qemuConf, dir string, dryRun bool) (*SetupResult, error) {
	res := &SetupResult{Changes: []string{}, Problems: []string{}, DryRun: dryRun, Libvirtd: "unchanged"}
	if !onTmpfs(dir) {
		return nil, fmt.Errorf("setup: memory backing dir %s is not on a tmpfs", dir)
	}
	if _, err := os.Stat(qemuConf); errors.Is(err, fs.ErrNotExist) && !dryRun {
		if err := os.MkdirAll(filepath.Dir(qemuConf), 0o700); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		if err := os.WriteFile(qemuConf, nil, 0o600); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
	}
	cur, err := configuredMemoryBackingDir(qemuConf)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if filepath.Clean(cur) != filepath.Clean(dir) {
		if !dryRun {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return nil, fmt.Errorf("setup: %w", err)
			}
			if err := setMemoryBackingDir(qemuConf, dir); err != nil {
				return nil, fmt.Errorf("setup: %w", err)
			}
		}
		res.Changes = append(res.Changes, fmt.Sprintf("set memory_backing_dir = %q in %s (was %q): the session daemon uses it from its next start", dir, qemuConf, cur))
		res.Libvirtd = "restart needed"
		res.Problems = append(res.Problems, "a session daemon running now keeps its old memory_backing_dir until it exits (two minutes after its last client and domain)")
	}
	res.MemoryBackingDir = strings.TrimSuffix(dir, "/") + "/libvirt/qemu"
	res.Changed = len(res.Changes) > 0
	return res, nil
}
