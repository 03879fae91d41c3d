package vmfork

import (
	"errors"
	"testing"
)

// noLinkDriver is the fake driver without LinkSetter: it can freeze and
// start children, but not keep their NIC link down.
type noLinkDriver struct {
	Driver
	Forker
}

// TestForkChecksCapabilitiesBeforePause: a live fork whose children would
// need a capability the driver lacks fails before the source is paused
// (Freeze is never called), and leaves no child record.
func TestForkChecksCapabilitiesBeforePause(t *testing.T) {
	d := newFakeDriver()
	mg := NewManager(newTestStore(t), noLinkDriver{d, d}, nil)
	bootFake(t, mg, "src")
	_, err := mg.Fork(t.Context(), ForkRequest{Source: "src", Count: 1})
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("fork with a driver that cannot set a link: %v, want ErrUnsupported", err)
	}
	if d.freezeSeen != 0 {
		t.Errorf("Freeze called %d times, want 0: the source was paused before the check", d.freezeSeen)
	}
	if got := machineNames(t, mg.Store); got != "src" {
		t.Errorf("machines after the refused fork: %s, want src", got)
	}
}
