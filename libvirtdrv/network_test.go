package libvirtdrv

import (
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
)

// TestChildXMLOnLibvirtNetwork: a child of a source on a libvirt network is
// on the same network with a port and tap of its own (the source's live
// portid, resolved bridge and tap name go), under the MAC its identity
// chain gives the guest, and QEMU announces nothing after the load.
func TestChildXMLOnLibvirtNetwork(t *testing.T) {
	src := strings.Replace(sourceXML(t), userNIC, networkNIC+"\n      <target dev='vnet3'/>", 1)
	c := testChild()
	c.GuestMAC = "52:54:00:11:22:33"
	d, err := ChildXML(src, c, Metadata{})
	if err != nil {
		t.Fatal(err)
	}
	ifc := d.Devices.Interfaces[0]
	if ifc.Source == nil || ifc.Source.Network == nil || ifc.Source.Network.Network != "lab" {
		t.Fatalf("child interface source %+v, want network lab", ifc.Source)
	}
	if n := ifc.Source.Network; n.PortID != "" || n.Bridge != "" || ifc.Target != nil {
		t.Errorf("child interface keeps the source's port %q, bridge %q or tap %+v", n.PortID, n.Bridge, ifc.Target)
	}
	if ifc.MAC == nil || ifc.MAC.Address != c.GuestMAC {
		t.Errorf("child MAC %+v, want the guest's own %s", ifc.MAC, c.GuestMAC)
	}
	if x := marshal(t, d); !strings.Contains(x, `<arg value="migration.announce-rounds=1">`) {
		t.Errorf("child XML does not turn off the announce after the load:\n%s", x)
	}
	if got := networkOf(d); got != (vmfork.Network{Kind: vmfork.NetworkLibvirt, Name: "lab"}) {
		t.Errorf("networkOf = %+v, want network=lab", got)
	}
}

func TestBootXMLNetworks(t *testing.T) {
	for _, n := range []vmfork.Network{
		{Kind: vmfork.NetworkBridge, Name: "br0"},
		{Kind: vmfork.NetworkLibvirt, Name: "lab"},
		{},
	} {
		m := testMachine()
		m.Spec.Network = n
		d := BootXML(m, Metadata{}, BootOptions{})
		if got := networkOf(d); got != n.Effective() {
			t.Errorf("boot on %v: domain is on %v", n, got)
		}
	}
}
