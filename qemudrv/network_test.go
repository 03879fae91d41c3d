package qemudrv

import (
	"errors"
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
