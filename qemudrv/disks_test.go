package qemudrv

import (
	"slices"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
)

// TestArgvExtraDisks: extra disks follow the boot disk in the spec's
// order, a shared one read-only; the guest-visible words are the same
// whatever each machine has behind its disks, so a child whose disk is
// shared (read-only) or fresh matches its template's manifest.
func TestArgvExtraDisks(t *testing.T) {
	m := testMachine()
	m.Spec.Disks = []vmfork.DiskSpec{{ID: "data", File: "/srv/data.qcow2"}, {ID: "iso", File: "/srv/iso.raw", Fork: vmfork.DiskShared}}
	m.Paths.Disks = map[string]vmfork.DiskFile{
		"data": {File: "/m/xdisk-data.qcow2"},
		"iso":  {File: "/srv/iso.raw", ReadOnly: true, Format: "raw"},
	}
	a := strings.Join(Argv(m, ArgvOptions{}), " ")
	for _, want := range []string{
		"-device virtio-blk-pci,drive=fmt0,id=disk0 -blockdev driver=file,filename=/m/xdisk-data.qcow2,node-name=xfile-data -blockdev driver=qcow2,file=xfile-data,node-name=xfmt-data -device virtio-blk-pci,drive=xfmt-data,id=vd-data",
		"-blockdev driver=file,filename=/srv/iso.raw,node-name=xfile-iso,read-only=on -blockdev driver=raw,file=xfile-iso,node-name=xfmt-iso,read-only=on -device virtio-blk-pci,drive=xfmt-iso,id=vd-iso",
	} {
		if !strings.Contains(a, want) {
			t.Errorf("argv lacks %q:\n%s", want, a)
		}
	}
	child := testMachine()
	child.Spec.Disks = m.Spec.Disks
	child.Paths.Disks = map[string]vmfork.DiskFile{
		"data": {File: "/t/disk-data.qcow2", ReadOnly: true},
		"iso":  {File: "/srv/iso.raw", ReadOnly: true, Format: "raw"},
	}
	if g, w := GuestVisible(Argv(child, ArgvOptions{})), GuestVisible(Argv(m, ArgvOptions{})); !slices.Equal(g, w) {
		t.Errorf("guest-visible words differ:\n%q\n%q", g, w)
	}
}

// TestArgvBlockDisk: a block device is opened with host_device (QEMU 6.0
// on refuses one under driver=file), in place with the format it holds;
// a child on an overlay over it has the same guest-visible words.
func TestArgvBlockDisk(t *testing.T) {
	m := testMachine()
	m.Spec.Disks = []vmfork.DiskSpec{{ID: "data", File: "/dev/vg0/data"}}
	m.Paths.Disks = map[string]vmfork.DiskFile{"data": {File: "/dev/vg0/data", Format: "raw", Block: true}}
	a := strings.Join(Argv(m, ArgvOptions{}), " ")
	want := "-blockdev driver=host_device,filename=/dev/vg0/data,node-name=xfile-data -blockdev driver=raw,file=xfile-data,node-name=xfmt-data -device virtio-blk-pci,drive=xfmt-data,id=vd-data"
	if !strings.Contains(a, want) {
		t.Errorf("argv lacks %q:\n%s", want, a)
	}
	child := testMachine()
	child.Spec.Disks = m.Spec.Disks
	child.Paths.Disks = map[string]vmfork.DiskFile{"data": {File: "/m/c/xdisk-data.qcow2"}}
	if g, w := GuestVisible(Argv(child, ArgvOptions{})), GuestVisible(Argv(m, ArgvOptions{})); !slices.Equal(g, w) {
		t.Errorf("guest-visible words differ:\n%q\n%q", g, w)
	}
}
