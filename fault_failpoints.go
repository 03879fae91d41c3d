//go:build failpoints

package vmfork

import (
	"context"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/vmfork/vmfork/customize"
)

// Fault injection, compiled into test builds only (-tags failpoints; make
// build: bin/vmfork-failpoints), for the crash tests (tests/crash_test.go,
// docs/RELIABILITY.md). VMFORK_FAULT=POINT[:ACTION] makes this process act
// the first time it reaches POINT:
//
//	self  (default) SIGKILL this vmfork process, as a crash or kill -9 would
//	qemu  SIGKILL the QEMU process the point concerns, and carry on
//
// The product binary has neither the variable nor this code (fault_off.go).
// Unset, Fault costs one comparison of a string read once at start.
const FaultEnv = "VMFORK_FAULT"

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
