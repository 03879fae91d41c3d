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

// TestExtraTargets: a booted domain's extra disks follow vda in libvirt's
// order of names.
func TestExtraTargets(t *testing.T) {
	for i, want := range map[int]string{0: "vdb", 1: "vdc", 24: "vdz", 25: "vdaa", 26: "vdab", 50: "vdaz", 51: "vdba"} {
		if got := extraTarget(i); got != want {
			t.Errorf("extraTarget(%d) = %s, want %s", i, got, want)
		}
	}
}

// TestChildXMLBootedDisks: a child of a domain vmfork booted with extra
// disks (ids the user chose, targets vdb, vdc, ...) gets each disk's image
// by the id in its serial, whatever its target: a disk called vdc sits on
// target vdb. A disk shared at boot stays the source's read-only image.
func TestChildXMLBootedDisks(t *testing.T) {
	src := testMachine()
	src.Spec.Disks = []vmfork.DiskSpec{
		{ID: "vdc", File: "/srv/a.qcow2"},
		{ID: "ro", File: "/srv/ro.raw", Fork: vmfork.DiskShared},
		{ID: "data", File: "/srv/data.qcow2"},
	}
	src.Paths.Disks = map[string]vmfork.DiskFile{
		"vdc":  {File: "/var/lib/vmfork/machines/web/xdisk-vdc.qcow2"},
		"ro":   {File: "/srv/ro.raw", ReadOnly: true, Format: "raw"},
		"data": {File: "/var/lib/vmfork/machines/web/xdisk-data.qcow2"},
	}
	x, err := BootXML(src, Metadata{Machine: src.Name}, BootOptions{}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	c := testChild()
	c.Spec.Disks = src.Spec.Disks
	c.Paths.Disks = map[string]vmfork.DiskFile{
		"vdc":  {File: "/var/lib/vmfork/machines/web-1/xdisk-vdc.qcow2"},
		"ro":   {File: "/srv/ro.raw", ReadOnly: true, Format: "raw"},
		"data": {File: "/var/lib/vmfork/templates/web.1/disk-data.qcow2", ReadOnly: true},
	}
	d, err := ChildXML(x, c, Metadata{Machine: c.Name})
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		file, format, serial string
		ro                   bool
	}
	wants := map[string]want{
		"vda": {c.Paths.Disk, "qcow2", "", false},
		"vdb": {c.Paths.Disks["vdc"].File, "qcow2", "vdc", false},
		"vdc": {"/srv/ro.raw", "raw", "ro", true},
		"vdd": {c.Paths.Disks["data"].File, "qcow2", "data", true},
	}
	if len(d.Devices.Disks) != len(wants) {
		t.Fatalf("child has %d disks, want %d", len(d.Devices.Disks), len(wants))
	}
	for _, disk := range d.Devices.Disks {
		w := wants[diskName(&disk)]
		if got := (want{disk.Source.File.File, disk.Driver.Type, disk.Serial, disk.ReadOnly != nil}); got != w {
			t.Errorf("%s = %+v, want %+v", diskName(&disk), got, w)
		}
	}
}
