package libvirtdrv

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork/qemustate"
)

func args(d *libvirtxml.Domain) string {
	var v []string
	for _, a := range d.QEMUCommandline.Args {
		v = append(v, a.Value)
	}
	return strings.Join(v, " ")
}

// TestAddDevicesOnlyArgs checks that a child readied for a device-sections
// file gets qemustate.DevicesOnlyArgs next to -incoming defer, and that its own
// child, derived from its XML (which carries them), does not get them twice.
func TestAddDevicesOnlyArgs(t *testing.T) {
	c := testChild()
	md := Metadata{Machine: c.Name, MachineDir: c.Paths.Dir, Parent: "web", Template: "web.1", TemplateRAM: c.Paths.RAM}
	d, err := ChildXML(sourceXML(t), c, md)
	if err != nil {
		t.Fatal(err)
	}
	before := args(d)
	if strings.Contains(before, "send-configuration") {
		t.Fatalf("ChildXML alone already has %q", before)
	}
	addDevicesOnlyArgs(d)
	want := strings.Join(qemustate.DevicesOnlyArgs, " ")
	got := args(d)
	if got != before+" "+want {
		t.Fatalf("args %q, want %q followed by %q", got, before, want)
	}
	if !strings.Contains(got, "-incoming defer") {
		t.Errorf("args %q lost -incoming defer", got)
	}
	if d.OnReboot != "destroy" {
		t.Errorf("on_reboot %q, want destroy: a reboot would spin on an empty firmware", d.OnReboot)
	}

	// The grandchild: the child's XML is its source's.
	gc := testChild()
	gc.Name, gc.Parent, gc.Template = "web-1-1", "web-1", "web-1.1"
	gd, err := ChildXML(marshal(t, d), gc, Metadata{Machine: gc.Name, MachineDir: gc.Paths.Dir, Parent: "web-1", Template: "web-1.1"})
	if err != nil {
		t.Fatal(err)
	}
	addDevicesOnlyArgs(gd)
	if n := strings.Count(args(gd), want); n != 1 {
		t.Errorf("grandchild args %q hold %q %d times, want once", args(gd), want, n)
	}

	// A domain with no <qemu:commandline> at all.
	bare := &libvirtxml.Domain{}
	addDevicesOnlyArgs(bare)
	if args(bare) != want {
		t.Errorf("bare domain args %q, want %q", args(bare), want)
	}
}
