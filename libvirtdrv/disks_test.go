package libvirtdrv

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
)

// TestChildXMLExtraDisks: a source with two writable file disks and a
// read-only one (an adopted domain, nothing edited) gets a child whose
// second writable disk points at the child's image for its target, read-only
// when the fork shares it; the guest sees the same devices.
func TestChildXMLExtraDisks(t *testing.T) {
	src := strings.Replace(sourceXML(t), "<controller type='usb'",
		"<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/srv/b.img'/><target dev='vdb' bus='virtio'/></disk>"+
			"<disk type='file' device='disk'><source file='/srv/c.qcow2'/><target dev='vdc' bus='virtio'/><readonly/></disk><controller type='usb'", 1)
	for _, ro := range []bool{false, true} {
		c := testChild()
		c.Spec.Disks = []vmfork.DiskSpec{{ID: "vdb", File: "/srv/b.img"}}
		c.Paths.Disks = map[string]vmfork.DiskFile{"vdb": {File: "/var/lib/vmfork/machines/web-1/xdisk-vdb.qcow2", ReadOnly: ro}}
		d, err := ChildXML(src, c, Metadata{Machine: c.Name})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]libvirtxml.DomainDisk{}
		for _, x := range d.Devices.Disks {
			got[diskName(&x)] = x
		}
		if f := got["vda"].Source.File.File; f != c.Paths.Disk {
			t.Errorf("vda = %s, want %s", f, c.Paths.Disk)
		}
		vdb := got["vdb"]
		if vdb.Source.File.File != c.Paths.Disks["vdb"].File || vdb.Driver.Type != "qcow2" || (vdb.ReadOnly != nil) != ro {
			t.Errorf("vdb (read-only %v) = %s %s read-only %v", ro, vdb.Source.File.File, vdb.Driver.Type, vdb.ReadOnly != nil)
		}
		if f := got["vdc"].Source.File.File; f != "/srv/c.qcow2" {
			t.Errorf("read-only vdc = %s, want it as it was", f)
		}
		s := &libvirtxml.Domain{}
		if err := s.Unmarshal(src); err != nil {
			t.Fatal(err)
		}
		if pv, cv := GuestVisible(s), GuestVisible(d); strings.Join(pv, "\n") != strings.Join(cv, "\n") {
			t.Errorf("guest-visible configuration differs:\n%q\n%q", pv, cv)
		}
	}
	c := testChild()
	if _, err := ChildXML(src, c, Metadata{}); err == nil || !strings.Contains(err.Error(), `no disk "vdb"`) {
		t.Errorf("child without the second disk: %v, want one naming vdb", err)
	}
}
