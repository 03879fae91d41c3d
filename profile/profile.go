package profile

import (
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"regexp"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Accelerators.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// DefaultCPUModel runs under both accelerators and migrates between hosts; "host" would tie a
// template to this CPU.
const DefaultCPUModel = "qemu64"

// ChooseAccel picks the accelerator: VMFORK_ACCEL (kvm or tcg) if set, else KVM when it is usable,
// else TCG, which it warns of on log: the user should know of that degradation. libvirt offers
// type='kvm' wherever /dev/kvm exists, so its driver needs this rule as much as the embedded one.
func ChooseAccel(log *logrus.Entry) (string, error) {
	switch v := os.Getenv("VMFORK_ACCEL"); v {
	case AccelKVM, AccelTCG:
		return v, nil
	case "":
	default:
		return "", fmt.Errorf("VMFORK_ACCEL=%q: want kvm or tcg", v)
	}
	if kvmUsable() {
		return AccelKVM, nil
	}
	log.Warn("KVM is not usable here: running under TCG software emulation (slower)")
	return AccelTCG, nil
}

// kvmUsable reports whether /dev/kvm can be opened for reading and writing and the CPU has
// hardware virtualization (vmx or svm). Both are needed: some sandboxes offer a /dev/kvm for
// para-virtualized guests only (PVM), on which an ordinary guest kernel hangs at boot.
func kvmUsable() bool {
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	return err == nil && hwVirtPattern.Match(cpuinfo)
}

var hwVirtPattern = regexp.MustCompile(`(?m)^flags\s*:.*\b(vmx|svm)\b`)

// RandomMAC returns a MAC in QEMU's 52:54:00 range with three random bytes.
func RandomMAC() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", b[0], b[1], b[2])
}

// FreePort returns port when it is free on 127.0.0.1, or, for port 0, a free port the kernel
// picks. It fails when port is taken.
func FreePort(port int) (int, error) {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return port, fmt.Errorf("host port %d is not free", port)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
