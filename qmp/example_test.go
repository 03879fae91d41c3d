package qmp_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// The child restore sequence of the reference (§6): load the parent's device state from a file
// passed as a descriptor, wait for the load to complete, and only then resume.
func ExampleMonitor_WaitMigration() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mon, err := qmp.Dial(ctx, "/var/lib/vmfork/machines/web-1/qmp.sock")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mon.Close()

	f, err := os.Open("/var/lib/vmfork/templates/t1/devstate")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer f.Close()

	caps := []qmp.Capability{{Name: qmp.CapXIgnoreShared, State: true}}
	if err := mon.MigrateSetCapabilities(ctx, caps); err != nil {
		fmt.Println(err)
		return
	}
	if err := qmp.GetFD(ctx, mon, "devstate", f); err != nil {
		fmt.Println(err)
		return
	}
	if err := mon.MigrateIncoming(ctx, "fd:devstate"); err != nil {
		fmt.Println(err)
		return
	}
	// A failed load makes QEMU exit; WaitMigration then returns ErrClosed at once.
	info, err := mon.WaitMigration(ctx, 10*time.Millisecond)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("loaded in %d ms\n", info.TotalTime)
	if err := mon.Cont(ctx); err != nil { // never before "completed"
		fmt.Println(err)
	}
}

// Running a command in the guest through qemu-ga.
func ExampleAgent_Run() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agent, err := qmp.DialAgent(ctx, "/var/lib/vmfork/machines/web-1/qga.sock")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer agent.Close()
	st, err := agent.Run(ctx, qmp.ExecRequest{Path: "/bin/hostname", Args: []string{"web-1"}, CaptureOutput: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	if st.ExitCode != 0 {
		fmt.Printf("hostname: exit %d: %s\n", st.ExitCode, st.Stderr)
	}
}
