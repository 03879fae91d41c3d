package libvirtdrv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// SetupOptions say where libvirt's files are and what the hook runs.
type SetupOptions struct {
	HookDir  string // default DefaultHookDir
	QEMUConf string // default DefaultQEMUConf
	// Binary is the vmfork binary the hook runs (default: this executable).
	Binary string
	// MemoryBackingDir is the tmpfs to set as memory_backing_dir when the
	// current one is not on a tmpfs (default /dev/shm, where vmfork's own
	// templates live too, so the hook can hard-link them).
	MemoryBackingDir string
	// KVMDevice is the device to give udev's group and mode (default
	// KVMDevice).
	KVMDevice string
	// DryRun reports what would change and changes nothing.
	DryRun bool
	// Daemon reloads and restarts libvirtd (default: SystemDaemon).
	Daemon Daemon
}

// SetupResult is what Setup found and did. Its JSON form is a contract with
// scripts and Ansible: change it only by adding.
type SetupResult struct {
	Changed bool     `json:"changed"`
	Changes []string `json:"changes"`
	DryRun  bool     `json:"dry_run"`
	Hook    string   `json:"hook"`
	// MemoryBackingDir is where libvirt will put each domain's RAM directory.
	MemoryBackingDir string `json:"memory_backing_dir"`
	// Libvirtd is "unchanged", "reloaded" or "restarted" (or, in a dry run,
	// what would happen).
	Libvirtd string `json:"libvirtd"`
	// Problems are what stays wrong after setup, one line each (for
	// example a /dev/kvm that libvirt's QEMU user still cannot open).
	Problems []string `json:"problems"`
}

// Setup makes a libvirt host able to run vmfork's fork children, and is
// idempotent: a second run changes nothing and says so. It
//
//   - installs the start hook in HookDir: a small shell wrapper that hands
//     only domains carrying vmfork's metadata to `vmfork libvirt hook`, so a
//     missing or broken vmfork binary never stops another domain from starting;
//   - sets memory_backing_dir in qemu.conf to a tmpfs when the current one is
//     on disk, so a domain's shared RAM is not written back to disk and its
//     freeze copies tmpfs to tmpfs;
//   - gives /dev/kvm the group and mode udev would (kvm, 0660) where the host
//     has no udev: libvirt whose QEMU user cannot open it re-probes QEMU on
//     every API call (see kvm.go);
//   - restarts libvirtd when qemu.conf changed (qemu.conf is read at start
//     only), else sends it SIGHUP when the hook is new (libvirtd looks for
//     hooks at start and on SIGHUP).
func Setup(ctx context.Context, opt SetupOptions) (*SetupResult, error) {
	if opt.HookDir == "" {
		opt.HookDir = DefaultHookDir
	}
	if opt.QEMUConf == "" {
		opt.QEMUConf = DefaultQEMUConf
	}
	if opt.MemoryBackingDir == "" {
		opt.MemoryBackingDir = "/dev/shm"
	}
	if opt.Daemon == nil {
		opt.Daemon = SystemDaemon{}
	}
	if opt.KVMDevice == "" {
		opt.KVMDevice = KVMDevice
	}
	if opt.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("setup: find the vmfork binary: %w", err)
		}
		opt.Binary = exe
	}
	res := &SetupResult{Changes: []string{}, Problems: []string{}, DryRun: opt.DryRun, Libvirtd: "unchanged", Hook: filepath.Join(opt.HookDir, HookName)}

	kvmChanged, err := EnsureKVMAccess(opt.KVMDevice, opt.DryRun)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if kvmChanged != "" {
		res.Changes = append(res.Changes, kvmChanged)
	}

	hookChanged, err := installHook(res.Hook, hookScript(opt.Binary, opt.QEMUConf), opt.DryRun)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if hookChanged {
		res.Changes = append(res.Changes, "installed start hook "+res.Hook+" running "+opt.Binary)
	} else if st, err := os.Stat(opt.HookDir); err == nil && st.Mode().Perm()&0o005 != 0o005 {
		// An earlier setup under umask 077 made it 0700.
		if !opt.DryRun {
			if err := openHookDir(opt.HookDir); err != nil {
				return nil, fmt.Errorf("setup: %w", err)
			}
		}
		res.Changes = append(res.Changes, fmt.Sprintf("gave %s mode %04o so that users' session daemons can read it (was %04o)", opt.HookDir, st.Mode().Perm()|0o055, st.Mode().Perm()))
	}
	confChanged, err := ensureTmpfsMemoryDir(opt.QEMUConf, opt.MemoryBackingDir, opt.DryRun)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if confChanged != "" {
		res.Changes = append(res.Changes, confChanged)
	}
	if res.MemoryBackingDir, err = MemoryBackingDir(opt.QEMUConf); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if opt.DryRun && confChanged != "" {
		res.MemoryBackingDir = strings.TrimSuffix(opt.MemoryBackingDir, "/") + "/libvirt/qemu"
	}
	switch {
	case confChanged != "":
		res.Libvirtd = "restarted"
		if !opt.DryRun {
			if err := opt.Daemon.Restart(ctx); err != nil {
				return res, fmt.Errorf("setup: restart libvirtd for the new memory_backing_dir: %w", err)
			}
		}
	case hookChanged:
		res.Libvirtd = "reloaded"
		if !opt.DryRun {
			if err := opt.Daemon.Reload(ctx); err != nil {
				return res, fmt.Errorf("setup: make libvirtd see the new hook: %w", err)
			}
		}
	}
	if !opt.DryRun || confChanged == "" {
		// res.MemoryBackingDir is <memory_backing_dir>/libvirt/qemu.
		base := filepath.Dir(filepath.Dir(res.MemoryBackingDir))
		opened, err := openRAMDirs(base, res.MemoryBackingDir, opt.DryRun)
		if err != nil {
			return res, fmt.Errorf("setup: %w", err)
		}
		res.Changes = append(res.Changes, opened...)
	}
	res.Changed = len(res.Changes) > 0
	if !opt.DryRun || kvmChanged == "" {
		p, err := KVMProblem(opt.KVMDevice, opt.QEMUConf)
		if err != nil {
			return res, fmt.Errorf("setup: %w", err)
		}
		if p != "" {
			res.Problems = append(res.Problems, p)
		}
	}
	return res, nil
}

// hookScript is the drop-in. It runs for every domain on the host, so it
// does the cheap part in sh: only "start begin" and "release end" of a
// domain whose XML carries vmfork's namespace reach the vmfork binary.
func hookScript(binary, qemuConf string) string {
	return fmt.Sprintf(`#!/bin/sh
# Installed by "vmfork libvirt setup". For vmfork's fork children only, it
# links the frozen template RAM to where libvirt tells QEMU to find guest RAM
# at start, and has vmfork forget a child at release. It never calls libvirt.
# Other domains are not affected.
case "$2/$3" in start/begin|release/end) ;; *) exit 0 ;; esac
xml=$(cat)
case $xml in
*%s*) printf '%%s\n' "$xml" | exec %s libvirt hook --qemu-conf %s -- "$@" ;;
esac
exit 0
`, MetadataNS, shQuote(binary), shQuote(qemuConf))
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// installHook writes the hook if its content differs, and reports whether it did.
func installHook(path, script string, dryRun bool) (bool, error) {
	old, err := os.ReadFile(path)
	if err == nil && bytes.Equal(old, []byte(script)) {
		if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o100 != 0 {
			return false, nil
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("read hook: %w", err)
	}
	if dryRun {
		return true, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, fmt.Errorf("create hook dir: %w", err)
	}
	if err := openHookDir(filepath.Dir(path)); err != nil {
		return false, err
	}
	return true, writeFileAtomic(path, []byte(script), 0o755)
}

// openHookDir makes the hook drop-in directory readable and searchable by
// all, as libvirt's own hooks directory is: every user's session daemon
// (qemu:///session) lists it at start and exits when it cannot ("cannot
// open directory '/etc/libvirt/hooks/qemu.d': Permission denied"), which a
// MkdirAll under umask 077 would cause.
func openHookDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if st.Mode().Perm()&0o055 == 0o055 {
		return nil
	}
	if err := os.Chmod(dir, st.Mode().Perm()|0o055); err != nil {
		return fmt.Errorf("open hook dir %s to session daemons: %w", dir, err)
	}
	return nil
}

// ensureTmpfsMemoryDir sets memory_backing_dir to dir unless libvirt's RAM
// directory is on a tmpfs already. It returns a description of the change,
// or "" when none was needed.
func ensureTmpfsMemoryDir(qemuConf, dir string, dryRun bool) (string, error) {
	cur, err := MemoryBackingDir(qemuConf)
	if err != nil {
		return "", err
	}
	if onTmpfs(cur) {
		return "", nil
	}
	if !onTmpfs(dir) {
		return "", fmt.Errorf("memory backing dir %s is not on a tmpfs", dir)
	}
	change := fmt.Sprintf("set memory_backing_dir = %q in %s (was %s, not a tmpfs)", dir, qemuConf, cur)
	if dryRun {
		return change, nil
	}
	return change, setMemoryBackingDir(qemuConf, dir)
}

// setMemoryBackingDir sets memory_backing_dir to dir in qemuConf.
func setMemoryBackingDir(qemuConf, dir string) error {
	data, err := os.ReadFile(qemuConf)
	if err != nil {
		return fmt.Errorf("read %s: %w", qemuConf, err)
	}
	// Earlier settings are commented out, not deleted, so the change is easy
	// to see and undo.
	lines := strings.SplitAfter(string(data), "\n")
	for i, l := range lines {
		if memoryBackingDirLine.MatchString(l) {
			lines[i] = "#" + l
		}
	}
	out := strings.Join(lines, "")
	if out != "" && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	out += fmt.Sprintf("# Set by \"vmfork libvirt setup\": guest RAM files on tmpfs.\nmemory_backing_dir = %q\n", dir)
	st, err := os.Stat(qemuConf)
	if err != nil {
		return err
	}
	return writeFileAtomic(qemuConf, []byte(out), st.Mode().Perm())
}

// onTmpfs reports whether path, or its nearest existing ancestor, is on a tmpfs.
func onTmpfs(path string) bool {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err == nil {
			return st.Type == unix.TMPFS_MAGIC
		}
		if p == "/" {
			return false
		}
	}
}

func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".vmfork-tmp")
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	if err := os.Chmod(tmp, perm); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// openRAMDirs gives each existing directory from below base down to dir
// (memory_backing_dir's libvirt/ and libvirt/qemu/) search permission for
// others, if it lacks it, and says what it changed. libvirt's QEMU user
// must pass through them to its domain's RAM file; a libvirtd started
// under umask 077 (as vmfork's setup did before it set 022) made them 0700.
func openRAMDirs(base, dir string, dryRun bool) ([]string, error) {
	base, dir = filepath.Clean(base), filepath.Clean(dir)
	rel, err := filepath.Rel(base, dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return nil, nil // not below base: libvirt's own default, not ours
	}
	var changes []string
	d := base
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		d = filepath.Join(d, part)
		st, err := os.Stat(d)
		if errors.Is(err, fs.ErrNotExist) {
			break // libvirtd makes it at its next domain start
		}
		if err != nil {
			return changes, err
		}
		mode := st.Mode().Perm()
		if mode&0o001 != 0 {
			continue
		}
		if !dryRun {
			if err := os.Chmod(d, mode|0o011); err != nil {
				return changes, fmt.Errorf("open %s to libvirt's QEMU user: %w", d, err)
			}
		}
		changes = append(changes, fmt.Sprintf("gave %s mode %04o so that libvirt's QEMU user can reach its RAM files (was %04o)", d, mode|0o011, mode))
	}
	return changes, nil
}
