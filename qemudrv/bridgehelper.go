package qemudrv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork"
)

// Joining a bridge without CAP_NET_ADMIN: through qemu-bridge-helper.
//
// An ordinary user cannot create a tap (TUNSETIFF needs CAP_NET_ADMIN), so
// vmfork asks the helper QEMU ships for this (Debian's qemu-system-common:
// /usr/lib/qemu/qemu-bridge-helper), which may when it is setuid root (or
// has the file capability cap_net_admin) and /etc/qemu/bridge.conf allows
// the bridge. vmfork runs it itself, the way QEMU's -netdev bridge would,
// and receives the tap's descriptor over a socket pair: QEMU then gets the
// same -netdev tap,fd=3 as when vmfork makes the tap, so a source and its
// children agree on the NIC whoever made their taps, and the tap still
// lives exactly as long as QEMU (the helper makes it non-persistent).

// bridgeHelpers are where the helper is looked for when VMFORK_BRIDGE_HELPER
// does not name it: Debian and Ubuntu's place, then Fedora's.
var bridgeHelpers = []string{"/usr/lib/qemu/qemu-bridge-helper", "/usr/libexec/qemu-bridge-helper"}

// tunDevice is the tun/tap clone device; a variable for tests.
var tunDevice = "/dev/net/tun"

// bridgeConf is the helper's allow list (compiled into it as
// CONFIG_QEMU_CONFDIR/bridge.conf); a variable for tests.
var bridgeConf = "/etc/qemu/bridge.conf"

// bridgeHelper finds the helper and checks that it can make a tap for a
// caller without CAP_NET_ADMIN, and that its allow list lets it join bridge
// where vmfork can read the list. Each refusal is one line that names the
// setup command.
func bridgeHelper(bridge string) (string, error) {
	path := os.Getenv("VMFORK_BRIDGE_HELPER")
	if path == "" {
		for _, p := range bridgeHelpers {
			if _, err := os.Stat(p); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		return "", fmt.Errorf("vmfork makes a tap itself only with CAP_NET_ADMIN, and otherwise joins the bridge through qemu-bridge-helper, which is not installed (%s: apt-get install qemu-system-common) — or run vmfork as root, or use --network user: %w",
			bridgeHelpers[0], vmfork.ErrUnsupported)
	}
	if err := helperPrivileged(path); err != nil {
		return "", err
	}
	// Debian's helper drops to the caller's uid, keeping CAP_NET_ADMIN
	// alone, before it opens the tun device: the caller must be allowed
	// to open it (udev makes it 0666; some hosts keep it 0600).
	if err := unix.Access(tunDevice, unix.R_OK|unix.W_OK); err != nil {
		return "", fmt.Errorf("qemu-bridge-helper opens %s as you, with CAP_NET_ADMIN alone, and you may not (%v): as root, `chmod 0666 %s` (udev's default: a tap still needs CAP_NET_ADMIN), or run vmfork as root: %w",
			tunDevice, err, tunDevice, vmfork.ErrUnsupported)
	}
	if err := bridgeAllowed(bridgeConf, bridge); err != nil {
		return "", err
	}
	return path, nil
}

// helperPrivileged says in one line why the helper at path cannot make a
// tap: it needs to be setuid root, or have cap_net_admin in its file
// capabilities, on a file system that honours them.
func helperPrivileged(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("qemu-bridge-helper %s: %w", path, asUnsupported(err))
	}
	setuid := st.Mode&unix.S_ISUID != 0 && st.Uid == 0
	if !setuid && !fileHasNetAdmin(path) {
		return fmt.Errorf("vmfork joins the bridge through %s without CAP_NET_ADMIN, and the helper is neither setuid root nor cap_net_admin: as root, `chmod u+s %s` (Debian installs it without the bit), or run vmfork as root: %w",
			path, path, vmfork.ErrUnsupported)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err == nil && sfs.Flags&unix.ST_NOSUID != 0 {
		return fmt.Errorf("qemu-bridge-helper %s is on a file system mounted nosuid, where its privilege does not apply: put it on another (VMFORK_BRIDGE_HELPER names it), or run vmfork as root: %w",
			path, vmfork.ErrUnsupported)
	}
	return nil
}

// fileHasNetAdmin reports whether path's file capabilities (the
// security.capability attribute, struct vfs_cap_data) grant CAP_NET_ADMIN
// as effective and permitted.
func fileHasNetAdmin(path string) bool {
	buf := make([]byte, 24)
	n, err := unix.Getxattr(path, "security.capability", buf)
	if err != nil || n < 8 {
		return false
	}
	magic := binary.LittleEndian.Uint32(buf[0:4])
	permitted := binary.LittleEndian.Uint32(buf[4:8]) // capabilities 0-31
	const effective = 0x000001                        // VFS_CAP_FLAGS_EFFECTIVE
	return magic&effective != 0 && permitted&(1<<unix.CAP_NET_ADMIN) != 0
}

// bridgeAllowed reads the helper's allow list as the helper would (allow
// and deny lines, "all", include; a deny wins) and refuses a bridge it
// would deny, in one line naming the line to add. A list vmfork may not
// read is left to the helper, whose own refusal is reported then.
func bridgeAllowed(conf, bridge string) error {
	allow, deny, err := readBridgeConf(conf, bridge, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("qemu-bridge-helper allows no bridge: %s does not exist: as root, `mkdir -p %s && echo 'allow %s' >> %s`: %w",
			conf, filepath.Dir(conf), bridge, conf, vmfork.ErrUnsupported)
	case errors.Is(err, fs.ErrPermission):
		return nil
	case err != nil:
		return fmt.Errorf("qemu-bridge-helper's allow list: %w", asUnsupported(err))
	case deny:
		return fmt.Errorf("%s denies bridge %q to qemu-bridge-helper: as root, remove its deny line for it and add `allow %s`: %w",
			conf, bridge, bridge, vmfork.ErrUnsupported)
	case !allow:
		return fmt.Errorf("%s does not allow bridge %q to qemu-bridge-helper: as root, `echo 'allow %s' >> %s`: %w",
			conf, bridge, bridge, conf, vmfork.ErrUnsupported)
	}
	return nil
}

// readBridgeConf reports whether the list at path (and those it includes)
// allows and denies bridge.
func readBridgeConf(path, bridge string, depth int) (allow, deny bool, err error) {
	if depth > 8 {
		return false, false, fmt.Errorf("%s: includes nest deeper than 8", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return false, false, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch f[0] {
		case "allow":
			allow = allow || f[1] == "all" || f[1] == bridge
		case "deny":
			deny = deny || f[1] == "all" || f[1] == bridge
		case "include":
			a, d, err := readBridgeConf(f[1], bridge, depth+1)
			if err != nil {
				return false, false, err
			}
			allow, deny = allow || a, deny || d
		}
	}
	return allow, deny, nil
}

// helperTap runs the helper at path to make a tap on bridge and returns its
// descriptor (the only one, once the helper has exited) and name.
func helperTap(ctx context.Context, path, bridge string) (tap *os.File, name string, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("qemu-bridge-helper: socket pair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "bridge-helper"), os.NewFile(uintptr(fds[1]), "bridge-helper")
	defer ours.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The same arguments QEMU's -netdev bridge gives it; --use-vnet asks
	// for IFF_VNET_HDR, as every tap vmfork makes has.
	cmd := exec.CommandContext(ctx, path, "--use-vnet", "--br="+bridge, fmt.Sprintf("--fd=%d", 3))
	cmd.ExtraFiles = []*os.File{theirs}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	err = cmd.Run()
	theirs.Close()
	if err != nil {
		msg := strings.Join(strings.Fields(stderr.String()), " ")
		if strings.Contains(msg, "access denied") {
			msg += fmt.Sprintf(" (as root, `echo 'allow %s' >> %s`)", bridge, bridgeConf)
		}
		return nil, "", fmt.Errorf("qemu-bridge-helper %s --br=%s: %v: %s: %w", path, bridge, err, msg, vmfork.ErrUnsupported)
	}
	fd, err := recvFD(int(ours.Fd()))
	if err != nil {
		return nil, "", fmt.Errorf("qemu-bridge-helper %s --br=%s: receive the tap: %w", path, bridge, err)
	}
	tap = os.NewFile(uintptr(fd), "/dev/net/tun")
	ifr, err := unix.NewIfreq("")
	if err == nil {
		err = unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr)
	}
	if err != nil {
		tap.Close()
		return nil, "", fmt.Errorf("qemu-bridge-helper %s --br=%s: the descriptor it sent is no tap: %w", path, bridge, err)
	}
	return tap, ifr.Name(), nil
}

// recvFD receives one descriptor (SCM_RIGHTS) from socket s, close-on-exec.
func recvFD(s int) (int, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(s, buf, oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
	if err != nil {
		return -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return -1, err
	}
	for _, m := range msgs {
		if fds, err := unix.ParseUnixRights(&m); err == nil && len(fds) > 0 {
			for _, extra := range fds[1:] {
				unix.Close(extra)
			}
			return fds[0], nil
		}
	}
	return -1, errors.New("no descriptor in the message")
}

func asUnsupported(err error) error {
	return fmt.Errorf("%v: %w", err, vmfork.ErrUnsupported)
}
