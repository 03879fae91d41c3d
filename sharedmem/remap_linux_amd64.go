package sharedmem

// Remapping a paused QEMU's guest RAM in place. QEMU 7.2 maps its RAM file
// once, at start, and offers no command to map it again; but the kernel lets
// a tracer make the process run one system call. vmfork uses that to replace
// the RAM mapping with a private (copy-on-write) mapping of a frozen file at
// the same address: the guest sees the same bytes, QEMU keeps every pointer,
// socket, connection and thread, and the guest's later writes go to private
// pages instead of the file. QEMU still counts the block as share=on, so
// x-ignore-shared keeps it out of the next device-state save.
//
// The injected call runs in QEMU's main thread while it waits in ppoll (the
// main loop) and vCPUs are stopped, so nothing reads guest RAM concurrently;
// mmap(MAP_FIXED) replaces the mapping atomically anyway. The thread is
// stopped with PTRACE_INTERRUPT right after a syscall instruction, which is
// reused: no code is written into QEMU.

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// syscallInsn is the x86-64 "syscall" instruction.
var syscallInsn = [2]byte{0x0f, 0x05}

// restartCodes are the kernel-internal returns of an interrupted system call
// that the kernel restarts by stepping back over the syscall instruction.
const (
	errRestartSys         = -512
	errRestartNoIntr      = -513
	errRestartNoHand      = -514
	errRestartRestartBlck = -516
)

// Remap makes the guest RAM mapping m of process m.PID a private mapping of
// the file that process holds open as fd, from offset 0, and then makes the
// process's descriptor blockFD (QEMU's own handle on its RAM file) a
// duplicate of fd: the file mapped before is then held neither by a mapping
// nor by a descriptor of the process. The process must not run guest code
// (QEMU paused); it is stopped only for the two calls.
func Remap(m Mapping, fd, blockFD int) error {
	errc := make(chan error, 1)
	go func() {
		// ptrace requests must come from the thread that attached. The
		// thread is not unlocked: it exits with the goroutine, leaving no
		// thread with tracer state behind.
		runtime.LockOSThread()
		errc <- remap(m, fd, blockFD)
	}()
	return <-errc
}

// CanRemap checks, while pid runs, that this process may trace it (root, or
// a descendant under Yama's ptrace_scope 1): it stops pid's main thread once,
// for well under a millisecond, and lets it go. A freeze asks before it
// pauses anything.
func CanRemap(pid int) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		t, err := seize(pid)
		if err == nil {
			err = t.release()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("trace pid %d: %w", pid, ptraceDenied(pid, err))
	}
	return nil
}

// DropShared drops the page-table entries of shared file mapping m while its
// process runs, chunk bytes per injected madvise(MADV_DONTNEED) (each stops
// the process's main thread for about as long as the kernel takes for that
// chunk; the guest's vCPUs run on). The data stays in the file: a shared
// mapping refaults from it. Remap must unmap every page the mapping still
// maps, about 1 µs each here, so dropping them before the pause leaves the
// pause only those the guest touched since. Never for a private mapping,
// whose private pages it would discard.
func DropShared(m Mapping, chunk int64) error {
	if !m.Shared {
		return fmt.Errorf("drop pages of pid %d: a private mapping holds the guest's own writes", m.PID)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- dropShared(m, chunk)
	}()
	return <-errc
}

func dropShared(m Mapping, chunk int64) error {
	for off := int64(0); off < m.Size(); off += chunk {
		n := min(chunk, m.Size()-off)
		t, err := seize(m.PID)
		if err != nil {
			return fmt.Errorf("drop pages of pid %d: %w", m.PID, err)
		}
		got, err := t.call(unix.SYS_MADVISE, m.Start+uintptr(off), uintptr(n), unix.MADV_DONTNEED)
		if err == nil && got != 0 {
			err = fmt.Errorf("madvise: %w", callErr(got))
		}
		if rerr := t.release(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		if err != nil {
			return fmt.Errorf("drop pages of pid %d: %w", m.PID, err)
		}
	}
	return nil
}

func remap(m Mapping, fd, blockFD int) error {
	t, err := seize(m.PID)
	if err != nil {
		return fmt.Errorf("remap RAM of pid %d: %w", m.PID, ptraceDenied(m.PID, err))
	}
	got, err := t.call(unix.SYS_MMAP, m.Start, uintptr(m.Size()), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_FIXED|unix.MAP_NORESERVE, uintptr(fd), 0)
	if err == nil && got != m.Start {
		err = fmt.Errorf("mmap: %w", callErr(got))
	}
	if err == nil {
		got, err = t.call(unix.SYS_DUP3, uintptr(fd), uintptr(blockFD), unix.O_CLOEXEC)
		if err == nil && got != uintptr(blockFD) {
			err = fmt.Errorf("dup3: %w", callErr(got))
		}
	}
	if derr := t.release(); derr != nil {
		err = errors.Join(err, derr)
	}
	if err != nil {
		return fmt.Errorf("remap RAM of pid %d: %w", m.PID, err)
	}
	return nil
}

func callErr(ret uintptr) error {
	if e := -int64(ret); e > 0 && e < 4096 {
		return unix.Errno(e)
	}
	return fmt.Errorf("unexpected return %#x", ret)
}

// tracee is a thread stopped by this tracer, with its registers as found.
type tracee struct {
	tid   int
	saved unix.PtraceRegs
}

// seize attaches to thread tid and stops it right after a system call
// instruction. A thread found elsewhere (running user code) is let go and
// tried again a little later.
func seize(tid int) (*tracee, error) {
	for try := 0; ; try++ {
		if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(tid), 0, unix.PTRACE_O_TRACESYSGOOD, 0, 0); e != 0 {
			return nil, fmt.Errorf("ptrace seize: %w", e)
		}
		t := &tracee{tid: tid}
		if err := t.stop(); err != nil {
			return nil, err
		}
		ok, err := t.atSyscall()
		if err != nil || ok {
			if err != nil {
				unix.PtraceDetach(tid)
			}
			return t, err
		}
		if err := unix.PtraceDetach(tid); err != nil {
			return nil, fmt.Errorf("ptrace detach: %w", err)
		}
		if try == 200 {
			return nil, errors.New("thread never stopped in a system call")
		}
		time.Sleep(time.Millisecond)
	}
}

// stop interrupts the seized thread and waits for its stop, passing on
// signals that arrive first.
func (t *tracee) stop() error {
	if err := unix.PtraceInterrupt(t.tid); err != nil {
		unix.PtraceDetach(t.tid)
		return fmt.Errorf("ptrace interrupt: %w", err)
	}
	for {
		ws, err := t.wait()
		if err != nil {
			return err
		}
		if ws.TrapCause() == unix.PTRACE_EVENT_STOP || (ws.StopSignal() != unix.SIGTRAP && ws>>16 == unix.PTRACE_EVENT_STOP) {
			return unix.PtraceGetRegs(t.tid, &t.saved)
		}
		// A signal-delivery stop: deliver the signal and wait on.
		if err := unix.PtraceCont(t.tid, int(ws.StopSignal())); err != nil {
			return fmt.Errorf("ptrace cont: %w", err)
		}
	}
}

func (t *tracee) wait() (unix.WaitStatus, error) {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(t.tid, &ws, unix.WALL, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return ws, fmt.Errorf("wait for pid %d: %w", t.tid, err)
		}
		if ws.Exited() || ws.Signaled() {
			return ws, fmt.Errorf("pid %d exited", t.tid)
		}
		return ws, nil
	}
}

// atSyscall reports whether the thread stopped just after a syscall
// instruction, which call can then run again with other registers.
func (t *tracee) atSyscall() (bool, error) {
	if int64(t.saved.Orig_rax) < 0 {
		return false, nil
	}
	var b [2]byte
	if _, err := unix.PtracePeekText(t.tid, uintptr(t.saved.Rip-2), b[:]); err != nil {
		return false, fmt.Errorf("ptrace peek: %w", err)
	}
	return b == syscallInsn, nil
}

// call makes the thread run system call nr with args and returns its raw
// result (a negative errno on failure).
func (t *tracee) call(nr uintptr, args ...uintptr) (uintptr, error) {
	var a [6]uint64
	for i, v := range args {
		a[i] = uint64(v)
	}
	r := t.saved
	r.Rip = t.saved.Rip - 2
	r.Rax = uint64(nr)
	// orig_rax -1: the stop being left is no interrupted call to restart.
	r.Orig_rax = ^uint64(0)
	r.Rdi, r.Rsi, r.Rdx, r.R10, r.R8, r.R9 = a[0], a[1], a[2], a[3], a[4], a[5]
	if err := unix.PtraceSetRegs(t.tid, &r); err != nil {
		return 0, fmt.Errorf("ptrace setregs: %w", err)
	}
	entered, sig := false, 0
	for {
		if err := unix.PtraceSyscall(t.tid, sig); err != nil {
			return 0, fmt.Errorf("ptrace syscall: %w", err)
		}
		sig = 0
		ws, err := t.wait()
		if err != nil {
			return 0, err
		}
		if ws.StopSignal() != unix.SIGTRAP|0x80 {
			if ws>>16 == 0 { // a signal: deliver it (a handler returns here)
				sig = int(ws.StopSignal())
			}
			continue
		}
		var cur unix.PtraceRegs
		if err := unix.PtraceGetRegs(t.tid, &cur); err != nil {
			return 0, fmt.Errorf("ptrace getregs: %w", err)
		}
		// Stops of calls made by a signal handler are not ours.
		if cur.Orig_rax != uint64(nr) || cur.Rip != t.saved.Rip {
			continue
		}
		if !entered {
			entered = true
			continue
		}
		return uintptr(cur.Rax), nil
	}
}

// release puts the registers back as found, so that an interrupted call is
// restarted as the kernel would have, and lets the thread go.
func (t *tracee) release() error {
	r := t.saved
	switch int64(r.Rax) {
	case errRestartSys, errRestartNoIntr, errRestartNoHand:
		r.Rax, r.Rip = r.Orig_rax, r.Rip-2
	case errRestartRestartBlck:
		r.Rax, r.Rip = unix.SYS_RESTART_SYSCALL, r.Rip-2
	}
	r.Orig_rax = ^uint64(0)
	err := unix.PtraceSetRegs(t.tid, &r)
	if derr := unix.PtraceDetach(t.tid); derr != nil {
		return errors.Join(err, fmt.Errorf("ptrace detach: %w", derr))
	}
	if err != nil {
		return fmt.Errorf("ptrace setregs: %w", err)
	}
	return nil
}

// RemapSupported reports whether Remap works on this build.
const RemapSupported = true
