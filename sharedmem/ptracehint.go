package sharedmem

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// yamaScope is where Yama keeps its ptrace policy; a variable for tests.
var yamaScope = "/proc/sys/kernel/yama/ptrace_scope"

// ptraceDenied explains a refused PTRACE_SEIZE of pid in one line: which
// capability the remap needs and how a host is set up to do without it.
// An ordinary user may trace its own QEMU when Yama allows it; under Yama's
// ptrace_scope 1 only a descendant, or a process that named its tracers
// (prctl PR_SET_PTRACER): the embedded driver starts QEMU so under scope 1
// (qemudrv/ptracer.go), so this is a QEMU started otherwise (before the
// setting changed, by an older vmfork, or as root). process_vm_readv is
// refused by the same rules.
func ptraceDenied(pid int, err error) error {
	if !errors.Is(err, unix.EPERM) {
		return err
	}
	scope := "0"
	if b, rerr := os.ReadFile(yamaScope); rerr == nil {
		scope = strings.TrimSpace(string(b))
	}
	switch scope {
	case "0":
		return fmt.Errorf("%w: pid %d runs as another user or is not dumpable; tracing it needs CAP_SYS_PTRACE (run vmfork as the user that started it, or as root)", err, pid)
	case "1":
		return fmt.Errorf("%w: kernel.yama.ptrace_scope is 1 and pid %d was started without vmfork's Yama exception (before the setting changed, or by an older vmfork): `vmfork hibernate` and `vmfork resume` it (its QEMU then starts with it), or as root: sysctl -w kernel.yama.ptrace_scope=0; root forks it with CAP_SYS_PTRACE", err, pid)
	default: // 2: root only; 3: no one until reboot
		return fmt.Errorf("%w: kernel.yama.ptrace_scope is %s, which leaves tracing to root (CAP_SYS_PTRACE) or to no one; to fork as an ordinary user: sysctl -w kernel.yama.ptrace_scope=0 (after a reboot if it is 3)", err, scope)
	}
}
