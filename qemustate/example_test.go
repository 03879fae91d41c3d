package qemustate_test

import (
	"context"
	"fmt"
	"time"

	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
)

// The child restore sequence of the reference (§6): load the parent's device state from a file
// passed as a descriptor, wait for the load to complete, and only then resume.
func ExampleLoadDeviceState() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The child's QEMU was started with -incoming defer.
	mon, err := qmp.Dial(ctx, "/var/lib/vmfork/machines/web-1/qmp.sock")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mon.Close()

	// x-ignore-shared, as on the save: the guest's RAM is the template's file, not the stream.
	if err := qemustate.SetIgnoreShared(ctx, mon); err != nil {
		fmt.Println(err)
		return
	}
	// getfd, migrate-incoming "fd:devstate" and a wait for "completed". A failed load makes
	// QEMU exit; the wait then returns qmp.ErrClosed at once.
	err = qemustate.LoadDeviceState(ctx, mon, "devstate", "/var/lib/vmfork/templates/t1/devstate", 10*time.Millisecond, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := mon.Cont(ctx); err != nil { // never before "completed"
		fmt.Println(err)
	}
}
