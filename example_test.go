package vmfork

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// exampleManager opens a Manager the way an agent framework embedding
// vmfork would, on a store of its own, and boots the machine "agent". The
// examples use the unit tests' fake driver and fake guest agent, so that
// go test runs them without a VM; a program passes qemudrv.New(log) (or a
// libvirtdrv driver) instead, and sets Manager.Reaper so that TTLs are
// enforced after it exits (cmd/vmfork starts `vmfork reaper`).
func exampleManager() (mg *Manager, cleanup func()) {
	dir, err := os.MkdirTemp("", "vmfork-example-")
	if err != nil {
		panic(err)
	}
	store, err := OpenStore(filepath.Join(dir, "state"), filepath.Join(dir, "mem"))
	if err != nil {
		panic(err)
	}
	mg = NewManager(store, newAgentDriver(), nil)
	kernel := filepath.Join(dir, "vmlinuz")
	if err := os.WriteFile(kernel, []byte("fake kernel"), 0o600); err != nil {
		panic(err)
	}
	if _, err := mg.Boot(context.Background(), BootRequest{Name: "agent", Spec: Spec{Kernel: kernel, MemoryMiB: 256, CPUs: 1}}); err != nil {
		panic(err)
	}
	return mg, func() { os.RemoveAll(dir) }
}

// Fork a running machine into two children that continue from the same
// instant.
func ExampleManager_Fork() {
	mg, cleanup := exampleManager()
	defer cleanup()
	ctx := context.Background()
	res, err := mg.Fork(ctx, ForkRequest{Source: "agent", Names: []string{"try-a", "try-b"}, Identity: fakeGuestIdentity})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range res.Children {
		fmt.Println(c.Name, c.State)
	}
	// Output:
	// try-a running
	// try-b running
}

// Run a command in a machine through its guest agent.
func ExampleManager_Exec() {
	mg, cleanup := exampleManager()
	defer cleanup()
	st, err := mg.Exec(context.Background(), "agent", ExecRequest{Argv: []string{"/bin/sh", "-c", "echo hello from the guest"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("exit %d: %s", st.ExitCode, st.Stdout)
	// Output:
	// exit 0: hello from the guest
}

// Branch a machine three ways, run one try in each, keep the winner and
// remove the losers: the failing try and the one that hangs past its
// timeout lose.
func ExampleManager_Explore() {
	mg, cleanup := exampleManager()
	defer cleanup()
	res, err := mg.Explore(context.Background(), ExploreRequest{
		Source:     "agent",
		Tries:      []string{"echo patch A; exit 1", "sleep", "write /src/fix.c B; echo patch B"},
		TryTimeout: 200 * time.Millisecond,
		Watch:      []string{"/src"},
		KeepAs:     "agent-best",
		TTL:        time.Hour, // the winner too goes in an hour
		Identity:   fakeGuestIdentity,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, t := range res.Tries {
		fmt.Printf("try %d: exit %d, timed out %v, changed %v\n", t.Index, t.ExitCode, t.TimedOut, t.Changed)
	}
	fmt.Println("winner:", res.Winner, "from try", res.WinnerTry)
	fmt.Println("removed:", res.Removed)
	// Output:
	// try 1: exit 1, timed out false, changed []
	// try 2: exit -1, timed out true, changed []
	// try 3: exit 0, timed out false, changed [A /src/fix.c]
	// winner: agent-best from try 3
	// removed: [agent-try-1 agent-try-2 agent-try-3]
}

// Remove a machine with its files; its template goes with its last child.
func ExampleManager_Remove() {
	mg, cleanup := exampleManager()
	defer cleanup()
	ctx := context.Background()
	if _, err := mg.Fork(ctx, ForkRequest{Source: "agent", Names: []string{"scratch"}, Identity: fakeGuestIdentity}); err != nil {
		fmt.Println(err)
		return
	}
	if err := mg.Remove(ctx, "scratch", false); err != nil {
		fmt.Println(err)
		return
	}
	ms, _ := mg.List(ctx)
	ts, _ := mg.Store.ListTemplates()
	fmt.Println(len(ms), "machine,", len(ts), "templates")
	// Output:
	// 1 machine, 0 templates
}
