package libvirtdrv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// qemuPID reads the QEMU pid of a running local domain from libvirt's pid
// file. It returns 0 where there is none (a remote daemon): the
// pid is informational, libvirt is the authority on the domain's state.
func qemuPID(uri, name string) int {
	switch {
	case isLocalSystem(uri):
		return readPID("/run/libvirt/qemu/" + name + ".pid")
	case isLocalSession(uri):
		return readPID(sessionPIDFile(name))
	}
	return 0
}

// qemuLog is libvirt's log of a system domain's QEMU (command line, stderr).
func qemuLog(uri, name, fallback string) string {
	switch {
	case isLocalSystem(uri):
		return "/var/log/libvirt/qemu/" + name + ".log"
	case isLocalSession(uri):
		return sessionLog(name)
	}
	return fallback
}

func isLocalSystem(uri string) bool {
	return uri == "qemu:///system" || strings.HasPrefix(uri, "qemu:///system?")
}

// user is the DAC label of the user running vmfork, "+UID:+GID", for a
// domain of daemon uri; "" (no label) for a session daemon, which has no DAC
// driver and runs QEMU as that user anyway.
func user(uri string) string {
	if isLocalSession(uri) {
		return ""
	}
	return fmt.Sprintf("+%d:+%d", os.Geteuid(), os.Getegid())
}

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
