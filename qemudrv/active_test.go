package qemudrv

import "testing"

// TestImageFile: the file of a top as query-block names it. The json:
// form is what QEMU 7.2 reports for a freeze's new top once
// blockdev-snapshot linked it over a node whose name differs from the
// backing name in its header (the template's hard link): seen with
// blockdev-add + transaction/blockdev-snapshot on a -S QEMU.
func TestImageFile(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"/m/disk.qcow2", "/m/disk.qcow2"},
		{`json:{"backing": {"driver": "qcow2", "file": {"driver": "file", "filename": "/m/disk.qcow2"}}, "driver": "qcow2", "file": {"driver": "file", "filename": "/m/disk.1.qcow2"}}`, "/m/disk.1.qcow2"},
		{`json:{"driver": "qcow2", "file": "/m/disk.2.qcow2"}`, "/m/disk.2.qcow2"},
		{`json:{"driver": "nbd"}`, ""},
		{`json:{broken`, ""},
	} {
		if got := imageFile(c.in); got != c.want {
			t.Errorf("imageFile(%s) = %q, want %q", c.in, got, c.want)
		}
	}
}
