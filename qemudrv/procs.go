package qemudrv

import (
	"context"
	"syscall"
	"time"

	"github.com/vmfork/vmfork/internal/proc"
)

// procs is how the driver starts, watches and signals QEMU processes. New
// fills it with the real ones; the unit tests swap in fakes, so that Stop's
// escalation, a failed completion or a freeze run against a scripted QMP
// socket (qmp/qmptest) without a QEMU and without signalling any real PID.
type procs struct {
	spawn func(bin string, args []string, logPath string, opt spawnOptions) (*process, error)
	// alive reports whether pid is a live QEMU whose command line holds
	// marker (proc.Alive).
	alive  func(pid int, marker string) bool
	signal func(pid int, sig syscall.Signal) error
	// quitGrace bounds the wait for QEMU to exit after QMP quit; killGrace
	// the wait for the process to disappear after SIGKILL.
	quitGrace, killGrace time.Duration
}

func realProcs() procs {
	return procs{
		spawn: spawn, alive: proc.Alive, signal: syscall.Kill,
		quitGrace: 5 * time.Second, killGrace: 10 * time.Second,
	}
}

// waitGone polls until alive(pid, marker) is false or ctx ends, as
// proc.WaitGone does for the real liveness check.
func (p procs) waitGone(ctx context.Context, pid int, marker string) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for p.alive(pid, marker) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
