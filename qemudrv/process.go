package qemudrv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork"
)

// process is a QEMU process this CLI started. done is closed when it exits;
// err then holds how it exited.
type process struct {
	pid  int
	done chan struct{}
	err  error
	// signal sends a signal to pid; nil is syscall.Kill (a test's fake
	// process has its own).
	signal func(pid int, sig syscall.Signal) error
}

// spawnOptions are what a QEMU process gets besides its argv.
type spawnOptions struct {
	// extra become QEMU's descriptors 3, 4, ... (a tap, network.go).
	extra []*os.File
	// cgroup, if set, is the cgroup QEMU starts in (clone3 into it, so
	// that none of its sockets predates it: contract.go).
	cgroup *os.File
	// dieWithCLI: QEMU is killed when this CLI ends, however it ends (a
	// fork --to's loaded QEMU, which serves that one command: live.go).
	dieWithCLI bool
}

// spawn starts QEMU so that it outlives the CLI: its own process group (a
// Ctrl-C in the terminal does not reach it), stdin from /dev/null, and its
// output appended to logPath instead of a pipe the CLI would hold.
func spawn(bin string, args []string, logPath string, opt spawnOptions) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open QEMU log: %w", err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "# %s %s\n", time.Now().UTC().Format(time.RFC3339), shellQuote(append([]string{bin}, args...)))
	cmd := exec.Command(bin, args...)
	if needPtracerShim() {
		// vmfork itself, which execs QEMU in its place (ptracer.go):
		// the PID is QEMU's.
		cmd = exec.Command("/proc/self/exe", append([]string{bin}, args...)...)
		cmd.Env = append(os.Environ(), ptracerShimEnv+"=1")
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = opt.extra
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if opt.cgroup != nil {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(opt.cgroup.Fd())
	}
	start := cmd.Start
	if opt.dieWithCLI {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
		start = func() error { return startOnLastingThread(cmd) }
	}
	if err := start(); err != nil {
		return nil, fmt.Errorf("start QEMU: %w", err)
	}
	p := &process{pid: cmd.Process.Pid, done: make(chan struct{})}
	vmfork.Fault(vmfork.FaultQEMUSpawned, p.pid)
	// Reap the process while this CLI lives; once the CLI exits, init does.
	go func() {
		awaitExit(p.pid)
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// The thread that starts a process with Pdeathsig must outlive it: the
// signal comes when that thread ends, not the CLI, and Go ends a thread
// whose goroutine exits locked to it (the ptrace calls of a remap lock
// theirs). One goroutine, locked to its thread and never returning, starts
// every such process.
var (
	lastingOnce   sync.Once
	lastingStarts chan func()
)

func startOnLastingThread(cmd *exec.Cmd) error {
	lastingOnce.Do(func() {
		lastingStarts = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the CLI
			for f := range lastingStarts {
				f()
			}
		}()
	})
	errc := make(chan error, 1)
	lastingStarts <- func() { errc <- cmd.Start() }
	return <-errc
}

// awaitExit returns once process pid has exited, without reaping it. A wait
// call pending in this process would also collect the ptrace stops of a
// remap (sharedmem.Remap) of its QEMU, and the remap would then wait
// forever; a pidfd only becomes readable on exit. Without pidfds (Linux <
// 5.3) it returns at once and the caller's wait does the waiting.
func awaitExit(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	for {
		_, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// kill kills the process and waits for it to be reaped.
func (p *process) kill() {
	signal := p.signal
	if signal == nil {
		signal = syscall.Kill
	}
	_ = signal(p.pid, syscall.SIGKILL)
	<-p.done
}

// exitError describes how QEMU ended, with the tail of its log.
func exitError(err error, logPath string) error {
	msg := "QEMU exited"
	if err != nil {
		msg = "QEMU exited: " + err.Error()
	}
	if tail := logTail(logPath, 5); tail != "" {
		msg += ": " + tail
	}
	return errors.New(msg)
}

// logTail returns the last n lines of QEMU's log, without our own "#" lines,
// joined into one line.
func logTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "# ") {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

func shellQuote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`;&|<>(){}*?[]#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}
