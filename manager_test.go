package vmfork

import (
	"path/filepath"
	"testing"
)

// RemoveEnded is the libvirt release hook's removal of a child whose domain
// ended outside vmfork: it must remove exactly a running or paused fork child
// the driver sees stopped, with its template once its last child goes, and
// leave everything else as it is.
func TestRemoveEnded(t *testing.T) {
	mg, d := newTestManager(t)
	bootFake(t, mg, "src")
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "src", Count: 2, Identity: okChain}); err != nil {
		t.Fatal(err)
	}
	if got := machineNames(t, mg.Store); got != "src,src-1,src-2" {
		t.Fatalf("machines = %s", got)
	}
	templates := filepath.Join(mg.Store.StateDir, dirTemplates)

	// Still running (a new QEMU of the child): left.
	if err := mg.RemoveEnded(t.Context(), "src-1"); err != nil {
		t.Fatal(err)
	}
	// Not a fork child: left even though its QEMU is gone.
	d.mu.Lock()
	delete(d.running, "src")
	d.mu.Unlock()
	if err := mg.RemoveEnded(t.Context(), "src"); err != nil {
		t.Fatal(err)
	}
	// Unknown: nothing to do, no error.
	if err := mg.RemoveEnded(t.Context(), "nosuch"); err != nil {
		t.Fatalf("RemoveEnded(nosuch) = %v, want nil", err)
	}
	if got := machineNames(t, mg.Store); got != "src,src-1,src-2" {
		t.Fatalf("machines = %s, want all three left", got)
	}

	// Ended outside vmfork: removed; the template stays for src-2.
	d.mu.Lock()
	delete(d.running, "src-1")
	d.mu.Unlock()
	if err := mg.RemoveEnded(t.Context(), "src-1"); err != nil {
		t.Fatal(err)
	}
	if got := machineNames(t, mg.Store); got != "src,src-2" {
		t.Fatalf("machines = %s, want src-1 removed", got)
	}
	if n := dirEntries(t, templates); n != 1 {
		t.Fatalf("%d templates, want 1 while src-2 lives", n)
	}

	// Stopped through vmfork (record says stopped): left, record kept.
	if _, err := mg.Stop(t.Context(), "src-2", false); err != nil {
		t.Fatal(err)
	}
	if err := mg.RemoveEnded(t.Context(), "src-2"); err != nil {
		t.Fatal(err)
	}
	if got := machineNames(t, mg.Store); got != "src,src-2" {
		t.Fatalf("machines = %s, want stopped src-2 kept", got)
	}
}
