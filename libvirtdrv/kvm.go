package libvirtdrv

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	osuser "os/user"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// KVMDevice is the device QEMU opens for hardware virtualization.
const KVMDevice = "/dev/kvm"

// defaultQEMUUser is who libvirt runs QEMU as on Debian when qemu.conf sets
// no user (Debian builds libvirt with --with-qemu-user=libvirt-qemu).
const defaultQEMUUser = "libvirt-qemu"

// Why /dev/kvm matters to libvirt even under TCG: libvirt 9.0 records in its
// QEMU capability cache whether its QEMU user could use /dev/kvm. Where the
// device exists but that user cannot open it (root:root 0600 on hosts
// without udev), the check disagrees with the cache on every API call, the
// cache is judged stale and QEMU is probed again: ~4 s for each call, and
// children then start minutes late. udev's rule (group kvm, mode 0660) is
// what every normal host has.

// KVMProblem says why libvirt's QEMU user cannot use /dev/kvm, in one line,
// or returns "" when it can (or when there is no /dev/kvm at all: then
// libvirt uses TCG and caches that). qemuConf names libvirt's qemu.conf,
// whose `user` setting says who QEMU runs as.
func KVMProblem(dev, qemuConf string) (string, error) {
	st, err := os.Stat(dev)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("check %s: %w", dev, err)
	}
	name, err := qemuUser(qemuConf)
	if err != nil {
		return "", err
	}
	uid, gids, err := lookupUser(name)
	if err != nil {
		return "", fmt.Errorf("check %s: libvirt's QEMU user %q: %w", dev, name, err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if canReadWrite(st.Mode().Perm(), int(sys.Uid), int(sys.Gid), uid, gids) {
		return "", nil
	}
	return fmt.Sprintf("libvirt's QEMU user %s cannot open %s (%s %s), so libvirt re-probes QEMU on every call, "+
		"seconds each; run `vmfork libvirt setup`, or give %s group kvm and mode 0660 as udev does",
		name, dev, owner(sys.Uid, sys.Gid), modeString(st.Mode().Perm()), dev), nil
}

// EnsureKVMAccess gives dev the group and mode that Debian's udev rules give
// it (group kvm, mode 0660), when it exists and lacks them. It returns what it
// changed ("" for nothing); with dryRun it only says what it would change.
// The change lasts until the device node is made again (the next boot).
func EnsureKVMAccess(dev string, dryRun bool) (string, error) {
	st, err := os.Stat(dev)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("check %s: %w", dev, err)
	}
	grp, err := osuser.LookupGroup("kvm")
	if err != nil {
		return "", fmt.Errorf("give %s to group kvm: %w (no kvm group: is libvirt-daemon-system installed?)", dev, err)
	}
	gid, _ := strconv.Atoi(grp.Gid)
	sys := st.Sys().(*syscall.Stat_t)
	perm := st.Mode().Perm()
	if int(sys.Gid) == gid && perm&0o660 == 0o660 {
		return "", nil
	}
	newPerm := perm | 0o660
	change := fmt.Sprintf("gave %s group kvm and mode %s, as udev does (was %s %s), so libvirt's QEMU user can open it",
		dev, modeString(newPerm), owner(sys.Uid, sys.Gid), modeString(perm))
	if dryRun {
		return change, nil
	}
	if err := os.Chown(dev, -1, gid); err != nil {
		return "", fmt.Errorf("give %s to group kvm: %w", dev, err)
	}
	if err := os.Chmod(dev, newPerm); err != nil {
		return "", fmt.Errorf("chmod %s: %w", dev, err)
	}
	return change, nil
}

var qemuUserLine = regexp.MustCompile(`^\s*user\s*=\s*"([^"]*)"\s*(#.*)?$`)

// qemuUser is qemu.conf's `user` (the last setting wins), or Debian's
// default.
func qemuUser(qemuConf string) (string, error) {
	f, err := os.Open(qemuConf)
	if errors.Is(err, fs.ErrNotExist) {
		return defaultQEMUUser, nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", qemuConf, err)
	}
	defer f.Close()
	name := defaultQEMUUser
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := qemuUserLine.FindStringSubmatch(sc.Text()); m != nil {
			name = m[1]
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", qemuConf, err)
	}
	return name, nil
}

// lookupUser resolves a qemu.conf user ("name" or "+UID") to its uid and
// every group it is in; libvirt starts QEMU with all of them.
func lookupUser(name string) (int, []int, error) {
	var u *osuser.User
	var err error
	if id, ok := strings.CutPrefix(name, "+"); ok {
		u, err = osuser.LookupId(id)
	} else {
		u, err = osuser.Lookup(name)
	}
	if err != nil {
		return 0, nil, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	ids, err := u.GroupIds()
	if err != nil {
		ids = []string{u.Gid}
	}
	gids := make([]int, 0, len(ids))
	for _, g := range ids {
		if n, err := strconv.Atoi(g); err == nil {
			gids = append(gids, n)
		}
	}
	return uid, gids, nil
}

// canReadWrite applies the owner/group/other bits as the kernel does
// (root passes any check).
func canReadWrite(perm fs.FileMode, ownerUID, ownerGID, uid int, gids []int) bool {
	if uid == 0 {
		return true
	}
	if uid == ownerUID {
		return perm&0o600 == 0o600
	}
	for _, g := range gids {
		if g == ownerGID {
			return perm&0o060 == 0o060
		}
	}
	return perm&0o006 == 0o006
}

func owner(uid, gid uint32) string {
	u, g := strconv.Itoa(int(uid)), strconv.Itoa(int(gid))
	if x, err := osuser.LookupId(u); err == nil {
		u = x.Username
	}
	if x, err := osuser.LookupGroupId(g); err == nil {
		g = x.Name
	}
	return u + ":" + g
}

func modeString(perm fs.FileMode) string { return fmt.Sprintf("%04o", uint32(perm)) }
