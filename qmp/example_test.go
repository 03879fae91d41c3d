package qmp_test

import (
	"context"
	"fmt"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// Pausing the guest and waiting for QEMU to confirm it: subscribe first, then send the command,
// or the event may come before the subscription.
func ExampleMonitor_Events() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mon, err := qmp.Dial(ctx, "/var/lib/vmfork/machines/web/qmp.sock")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mon.Close()

	events, err := mon.Events(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := mon.Stop(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// Ends with an error wrapping qmp.ErrClosed at once if QEMU exits first.
	if _, err := qmp.WaitEvent(ctx, events, qmp.EventStop); err != nil {
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
