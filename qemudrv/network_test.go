package qemudrv

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
)

func TestCheckNetwork(t *testing.T) {
	d := New(nil)
	for _, c := range []struct {
		n    vmfork.Network
		says string // "" for accepted
	}{
		{vmfork.Network{}, ""},
		{vmfork.Network{Kind: vmfork.NetworkUser}, ""},
		{vmfork.Network{Kind: vmfork.NetworkNone}, ""},
		{vmfork.Network{Kind: vmfork.NetworkBridge, Name: "vmfnobr0"}, `bridge "vmfnobr0" does not exist`},
		{vmfork.Network{Kind: vmfork.NetworkLibvirt, Name: "default"}, "needs the libvirt driver"},
	} {
		m := testMachine()
		m.Spec.Network = c.n
		err := d.CheckNetwork(t.Context(), m)
		if c.says == "" {
			if err != nil {
				t.Errorf("network %v: %v, want accepted", c.n, err)
			}
			continue
		}
		if !errors.Is(err, vmfork.ErrInvalid) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), `machine "web"`) {
			t.Errorf("network %v: %v, want an ErrInvalid naming the machine and saying %q", c.n, err, c.says)
		}
	}
}

// Without CAP_NET_ADMIN a bridge is refused in one line naming the
// capability and the ways out, before anything is made.
func TestCheckNetworkBridgeNeedsNetAdmin(t *testing.T) {
	old := hasCap
	t.Cleanup(func() { hasCap = old })
	hasCap = func(int) bool { return false }
	m := testMachine()
	m.Spec.Network = vmfork.Network{Kind: vmfork.NetworkBridge, Name: "br0"}
	err := New(nil).CheckNetwork(t.Context(), m)
	if !errors.Is(err, vmfork.ErrUnsupported) || !strings.Contains(err.Error(), "CAP_NET_ADMIN") ||
		!strings.Contains(err.Error(), "--network user") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("bridge without CAP_NET_ADMIN: %v; want one ErrUnsupported line naming CAP_NET_ADMIN and --network user", err)
	}
	if !old(0) && os.Geteuid() == 0 {
		t.Errorf("root has no CAP_CHOWN in its effective set: hasCap reads the wrong word")
	}
}
