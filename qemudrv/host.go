package qemudrv

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
)

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

// qemuBinary finds the QEMU binary: d.QEMU, or qemu-system-x86_64 on PATH.
func (d *Driver) qemuBinary() (string, error) {
	name := "qemu-system-x86_64"
	if d.QEMU != "" {
		name = d.QEMU
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("find QEMU: %w (install qemu-system-x86)", err)
	}
	return p, nil
}
