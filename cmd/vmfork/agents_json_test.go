package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
)

// The JSON of explore, tree, gc and ls's TTL keys is a contract with
// agents and scripts, golden-tested like the rest (-update rewrites it).
func TestAgentsJSONGolden(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	score := 7.5
	explore := &vmfork.ExploreResult{
		Source: "web", Template: "web.1", Winner: "web-best", WinnerTry: 2, PauseMS: 70.2, ElapsedMS: 4200.5,
		Kept: []string{"web-best"}, Removed: []string{"web-try-1", "web-try-2"},
		Tries: []vmfork.TryResult{
			{Index: 1, Command: "make test", Branch: "web-try-1", ExitCode: 2, DurationMS: 3100, Stderr: "FAIL\n"},
			{Index: 2, Command: "make test CC=clang", Branch: "web-try-2", DurationMS: 2900, Stdout: "ok\n",
				Changed: []string{"M /srv/app/main.o"}, ChangedCount: 1, Score: &score},
		},
	}
	tree := &vmfork.Tree{HeldBytes: 300 << 20, SavedBytes: 100 << 20, Roots: []*vmfork.TreeNode{{
		Kind: vmfork.NodeMachine, Name: "web", State: vmfork.StateRunning, Created: at, AgeS: 600, RAMBytes: 200 << 20, DiskBytes: 1 << 20,
		Children: []*vmfork.TreeNode{{
			Kind: vmfork.NodeTemplate, Name: "web.1", Kept: "golden", Created: at, AgeS: 300, RAMBytes: 90 << 20,
			Children: []*vmfork.TreeNode{{Kind: vmfork.NodeRemoved, Name: "web-1"}},
		}},
	}}}
	gc := vmfork.ReapResult{Removed: []string{"web-try-3"}, Released: []string{}, Pending: 1, Next: at}
	ls := machineView{Name: "web-try-3", State: vmfork.StateRunning, Driver: "qemu", Ports: []vmfork.PortForward{}, Created: at,
		Expires: at.Add(time.Hour), TTLLeftS: 3600}
	// ls.json has the rest of ls's keys; the TTL's are checked here only.
	if got, _ := json.Marshal(ls); !strings.Contains(string(got), `"expires":"2026-12-01T13:00:00Z","ttl_left_s":3600`) {
		t.Errorf("ls with a TTL: %s, want expires and ttl_left_s", got)
	}
	for name, v := range map[string]any{"explore.json": explore, "tree.json": tree, "gc.json": gc} {
		checkGolden(t, name, v)
	}
}
