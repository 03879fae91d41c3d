package brport

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWaitForwarding: a port that listens or learns is waited for until
// it forwards, at most two forward delays and a second; any other port, or
// an interface that is no bridge port, is not waited for.
func TestWaitForwarding(t *testing.T) {
	dir := t.TempDir()
	old := sysClassNet
	sysClassNet = dir
	t.Cleanup(func() { sysClassNet = old })
	port := func(tap, state, delay string) {
		t.Helper()
		for _, d := range []string{filepath.Join(dir, tap, "brport"), filepath.Join(dir, "br0", "bridge")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		os.WriteFile(filepath.Join(dir, tap, "brport", "state"), []byte(state+"\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "br0", "bridge", "forward_delay"), []byte(delay+"\n"), 0o644)
		os.Symlink(filepath.Join(dir, "br0"), filepath.Join(dir, tap, "master"))
	}
	ctx := context.Background()
	port("vmf0", "3", "200")
	port("vmf1", "4", "200")
	os.MkdirAll(filepath.Join(dir, "vmf2"), 0o755)
	for _, tap := range []string{"vmf0", "vmf1", "vmf2", "nosuch"} {
		if w := WaitForwarding(ctx, tap); w != 0 {
			t.Errorf("%s: waited %v, want no wait", tap, w)
		}
	}
	// Learning, forwarding 150 ms later.
	port("vmf3", "2", "200")
	go func() {
		time.Sleep(150 * time.Millisecond)
		os.WriteFile(filepath.Join(dir, "vmf3", "brport", "state"), []byte("3\n"), 0o644)
	}()
	if w := WaitForwarding(ctx, "vmf3"); w < 150*time.Millisecond || w > 2*time.Second {
		t.Errorf("learning port: waited %v, want until it forwards (150 ms)", w)
	}
	// Listening for good: given up after 2 × 0.1 s + 1 s.
	port("vmf4", "1", "10")
	if w := WaitForwarding(ctx, "vmf4"); w < 1200*time.Millisecond || w > 3*time.Second {
		t.Errorf("stuck port: waited %v, want about 1.2 s", w)
	}
	// The caller's context ends the wait.
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	port("vmf5", "1", "1500")
	if w := WaitForwarding(cctx, "vmf5"); w > time.Second {
		t.Errorf("cancelled: waited %v, want about 100 ms", w)
	}
}
