package vmfork

import (
	"context"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/vmfork/vmfork/customize"
)

// Fault injection, for the crash tests only (tests/crash_test.go,
// docs/RELIABILITY.md). VMFORK_FAULT=POINT[:ACTION] makes this process act
// the first time it reaches POINT:
//
//	self  (default) SIGKILL this vmfork process, as a crash or kill -9 would
//	qemu  SIGKILL the QEMU process the point concerns, and carry on
//
// Nothing a user runs sets it. Unset, Fault costs one comparison of a
// string read once at start.
const FaultEnv = "VMFORK_FAULT"

// Fault points, in the order a command reaches them.
const (
	// FaultForkReserved: a fork's journal entry and children's records
	// exist; the source is not paused yet.
	FaultForkReserved = "fork.reserved"
	// FaultFreezePaused: the source is paused, its disk switched and its
	// device state saved; its RAM is not frozen yet (driver).
	FaultFreezePaused = "freeze.paused"
	// FaultForkFrozen: the source runs again; no child has started.
	FaultForkFrozen = "fork.frozen"
	// FaultQEMUSpawned: a QEMU process exists whose PID no record holds
	// yet (driver; a boot, a fork child or a pool member).
	FaultQEMUSpawned = "qemu.spawned"
	// FaultForkRunning: a child's vCPUs run; its identity chain has not
	// started and its NIC link is down.
	FaultForkRunning = "fork.running"
	// FaultForkIdentity: a child's identity chain has run its first step
	// only.
	FaultForkIdentity = "fork.identity"
	// FaultSaveReserved: `template save` has recorded the kept template;
	// the source is not paused yet.
	FaultSaveReserved = "save.reserved"
	// FaultSaveFrozen: the kept template is frozen and the source runs;
	// its warm pool has not been started.
	FaultSaveFrozen = "save.frozen"
	// FaultPoolFilled: one warm-pool member has been started and recorded
	// while the pool is being filled; more are to come.
	FaultPoolFilled = "pool.filled"
	// FaultPoolTaken: a child has taken a pool member's process; the
	// device state is not loaded yet.
	FaultPoolTaken = "pool.taken"
	// FaultRmStopped: `rm` has killed the machine's QEMU; its record and
	// files are all still there.
	FaultRmStopped = "rm.stopped"
	// FaultRmRemoving: `rm` has taken the machine's record away; its files
	// are not deleted yet.
	FaultRmRemoving = "rm.removing"
)

// FaultPoints lists every point, for the tests and for checking a setting.
var FaultPoints = []string{
	FaultForkReserved, FaultFreezePaused, FaultForkFrozen, FaultQEMUSpawned,
	FaultForkRunning, FaultForkIdentity, FaultSaveReserved, FaultSaveFrozen,
	FaultPoolFilled, FaultPoolTaken, FaultRmStopped, FaultRmRemoving,
	FaultHibernateFrozen, FaultHibernateCommitted, FaultResumeRunning, // hibernate.go
	FaultRewindRunning, // checkpoint.go
}

var fault = parseFault(os.Getenv(FaultEnv))

type faultSpec struct {
	point, action string
	once          *sync.Once
}

func parseFault(s string) faultSpec {
	if s == "" {
		return faultSpec{}
	}
	point, action, _ := strings.Cut(s, ":")
	if action == "" {
		action = "self"
	}
	return faultSpec{point: point, action: action, once: new(sync.Once)}
}

// Fault is reached at point; pid is the QEMU process the point concerns (0
// for none). It does nothing unless VMFORK_FAULT names point. Drivers call
// it at the points that lie inside them.
func Fault(point string, pid int) {
	if fault.point != point {
		return
	}
	fault.once.Do(func() {
		switch fault.action {
		case "qemu":
			if pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		default:
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // nothing more of this command may run
		}
	})
}

// faultIdentity returns edit extended, when FaultForkIdentity is set, by a
// step after the chain's first one that reaches that point for child c.
func faultIdentity(edit func(customize.Chain) customize.Chain, c *Machine) func(customize.Chain) customize.Chain {
	if fault.point != FaultForkIdentity {
		return edit
	}
	return func(ch customize.Chain) customize.Chain {
		if edit != nil {
			ch = edit(ch)
		}
		names := ch.Names()
		if len(names) == 0 {
			return ch
		}
		return ch.AppendAfter(names[0], customize.Step{Name: "vmfork.Fault", Fn: func(context.Context, *customize.Env) error {
			Fault(FaultForkIdentity, c.PID)
			return nil
		}})
	}
}
