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
// ptrace_scope 1 only the QEMU a vmfork itself started (a child) can be, so
// a machine booted by an earlier command cannot.
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
		return fmt.Errorf("%w: kernel.yama.ptrace_scope is 1, so only root (CAP_SYS_PTRACE) may trace a QEMU another command started; to fork as an ordinary user: sysctl -w kernel.yama.ptrace_scope=0", err)
	default: // 2: root only; 3: no one until reboot
		return fmt.Errorf("%w: kernel.yama.ptrace_scope is %s, which leaves tracing to root (CAP_SYS_PTRACE) or to no one; to fork as an ordinary user: sysctl -w kernel.yama.ptrace_scope=0 (after a reboot if it is 3)", err, scope)
	}
}
