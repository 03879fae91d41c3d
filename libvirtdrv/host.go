package libvirtdrv

import (
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork"
)

// chooseAccel picks the accelerator: VMFORK_ACCEL (kvm or tcg) if set, else
// KVM when it is usable, else TCG. It is the embedded driver's rule: libvirt
// offers type='kvm' wherever /dev/kvm exists, also on hosts whose /dev/kvm
// runs no ordinary guest (no vmx/svm), where such a domain hangs at boot.
func chooseAccel() (string, error) {
	switch v := os.Getenv("VMFORK_ACCEL"); v {
	case accelKVM, accelTCG:
		return v, nil
	case "":
	default:
		return "", fmt.Errorf("VMFORK_ACCEL=%q: want kvm or tcg", v)
	}
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return accelTCG, nil
	}
	unix.Close(fd)
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err == nil && hwVirt.Match(cpuinfo) {
		return accelKVM, nil
	}
	return accelTCG, nil
}

var hwVirt = regexp.MustCompile(`(?m)^flags\s*:.*\b(vmx|svm)\b`)

// randomMAC returns a MAC in QEMU's 52:54:00 range with three random bytes.
func randomMAC() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", b[0], b[1], b[2])
}

// pickPorts checks that requested host ports are free and picks free ones for
// forwards that left the host port open (Host == 0).
func pickPorts(ports []vmfork.PortForward) error {
	for i := range ports {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[i].Host))
		if err != nil {
			return fmt.Errorf("host port %d is not free: %w", ports[i].Host, vmfork.ErrInvalid)
		}
		ports[i].Host = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	return nil
}

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
