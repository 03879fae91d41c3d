package qemudrv

import (
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// QEMU under Yama's ptrace_scope 1.
//
// A fork remaps the source QEMU's RAM with ptrace (sharedmem.Remap) and
// reads a child's own pages with process_vm_readv; both need ptrace
// access to the QEMU. Root has CAP_SYS_PTRACE. An ordinary user may trace
// its own processes, but Yama's ptrace_scope 1 (Ubuntu's and Fedora's
// default) narrows that to a process's descendants, and the `vmfork fork`
// that remaps a source is never its QEMU's ancestor: another vmfork
// command started it, and it has since been reparented to init.
//
// Yama lets a process name who may trace it (prctl PR_SET_PTRACER), and the
// exception outlives execve. So under ptrace_scope 1, without
// CAP_SYS_PTRACE, vmfork starts QEMU through itself: the re-executed
// vmfork (ptracerShimEnv set) declares any process of the same user a
// permitted tracer and execs QEMU in the same process. The same-user,
// dumpable checks still apply; only the descendant rule is lifted, for
// QEMU processes alone. Under ptrace_scope 2 or 3 no exception helps; the
// fork's refusal names the setting (sharedmem.ptraceDenied).

// ptracerShimEnv, set to "1" in vmfork's environment, makes it the shim:
// argv[1:] is QEMU's command line.
const ptracerShimEnv = "VMFORK_QEMU_PTRACER_SHIM"

// prSetPtracerAny is PR_SET_PTRACER_ANY ((unsigned long)-1).
const prSetPtracerAny = ^uintptr(0)

// yamaScope is Yama's setting; a variable for tests.
var yamaScope = "/proc/sys/kernel/yama/ptrace_scope"

func init() {
	// In init, on the main thread: the Yama exception belongs to the
	// thread group's leader, and an execve from another thread would
	// replace the leader's task and drop it.
	if os.Getenv(ptracerShimEnv) == "1" {
		ptracerShim(os.Args[1:])
	}
}

// ptracerShim declares any process of this user a permitted tracer and
// execs argv; it returns only to exit.
func ptracerShim(argv []string) {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "vmfork: ptracer shim: no command")
		os.Exit(127)
	}
	if err := unix.Prctl(unix.PR_SET_PTRACER, prSetPtracerAny, 0, 0, 0); err != nil {
		// QEMU still runs; a later fork of it says what Yama refused.
		fmt.Fprintf(os.Stderr, "vmfork: prctl(PR_SET_PTRACER_ANY): %v: forks of this machine need kernel.yama.ptrace_scope=0 or root\n", err)
	}
	os.Unsetenv(ptracerShimEnv)
	err := syscall.Exec(argv[0], argv, os.Environ())
	fmt.Fprintf(os.Stderr, "vmfork: exec %s: %v\n", argv[0], err)
	os.Exit(127)
}

// needPtracerShim reports whether QEMU must start through the shim: Yama
// restricts tracing to descendants and this process lacks CAP_SYS_PTRACE.
func needPtracerShim() bool {
	b, err := os.ReadFile(yamaScope)
	return err == nil && strings.TrimSpace(string(b)) == "1" && !hasCap(unix.CAP_SYS_PTRACE)
}
