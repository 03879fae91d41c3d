package qemudrv

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"
)

// chooseAccel picks the accelerator: VMFORK_ACCEL (kvm or tcg) if set,
// else KVM when it is usable, else TCG.
func chooseAccel() (string, error) {
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
	return AccelTCG, nil
}

// kvmUsable reports whether /dev/kvm can be opened for reading and writing
// and the CPU has hardware virtualization (vmx or svm). Both are needed:
// some sandboxes offer a /dev/kvm for para-virtualized guests only (PVM),
// on which an ordinary guest kernel hangs at boot.
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

var aliasPattern = regexp.MustCompile(`(?m)^q35\s.*\(alias of (pc-q35-[0-9.]+)\)`)

// resolveMachineType returns the versioned machine type that "q35" stands for
// in this QEMU (pc-q35-7.2 on Debian 12). Records keep the versioned name: a
// template only loads into the same machine type.
func resolveMachineType(ctx context.Context, qemu string) (string, error) {
	cmd := exec.CommandContext(ctx, qemu, "-machine", "help")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("failed to run %v: %w%s", cmd.Args, err, stderrOf(err))
	}
	m := aliasPattern.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s -machine help lists no q35 alias", qemu)
	}
	return string(m[1]), nil
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
		return ": " + strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}

// randomMAC returns a MAC in QEMU's 52:54:00 range with three random bytes.
func randomMAC() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", b[0], b[1], b[2])
}

// qemuBinary finds qemu-system-x86_64; VMFORK_QEMU overrides it (tests stub
// QEMU this way).
func qemuBinary() (string, error) {
	name := "qemu-system-x86_64"
	if v := os.Getenv("VMFORK_QEMU"); v != "" {
		name = v
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("find QEMU: %w (install qemu-system-x86)", err)
	}
	return p, nil
}
