package libvirtdrv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// qemuPID reads the QEMU pid of a running system domain from libvirt's pid
// file. It returns 0 where there is none (a session or remote daemon): the
// pid is informational, libvirt is the authority on the domain's state.
func qemuPID(uri, name string) int {
	if !isLocalSystem(uri) {
		return 0
	}
	data, err := os.ReadFile("/run/libvirt/qemu/" + name + ".pid")
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

// qemuLog is libvirt's log of a system domain's QEMU (command line, stderr).
func qemuLog(uri, name, fallback string) string {
	if isLocalSystem(uri) {
		return "/var/log/libvirt/qemu/" + name + ".log"
	}
	return fallback
}

func isLocalSystem(uri string) bool {
	return uri == "qemu:///system" || strings.HasPrefix(uri, "qemu:///system?")
}

// user is the DAC label of the user running vmfork, "+UID:+GID".
func user() string { return fmt.Sprintf("+%d:+%d", os.Geteuid(), os.Getegid()) }

// parseDACLabel parses "+UID:+GID" or "UID:GID" as libvirt writes a DAC label.
func parseDACLabel(label string) (uid, gid int, ok bool) {
	u, g, found := strings.Cut(label, ":")
	if !found {
		return 0, 0, false
	}
	uid, err1 := strconv.Atoi(strings.TrimPrefix(u, "+"))
	gid, err2 := strconv.Atoi(strings.TrimPrefix(g, "+"))
	return uid, gid, err1 == nil && err2 == nil
}
