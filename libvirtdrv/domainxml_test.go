package libvirtdrv

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
)

var update = flag.Bool("update", false, "rewrite golden files")

func testMachine() *vmfork.Machine {
	return &vmfork.Machine{
		Name:  "web",
		Accel: accelTCG,
		Spec: vmfork.Spec{
			Kernel: "/srv/guest/vmlinuz", Initrd: "/srv/guest/initrd.gz", Append: "console=ttyS0 quiet panic=-1",
			Disk: "/srv/guest/data.qcow2", MemoryMiB: 256, CPUs: 1,
			MachineType: "pc-q35-7.2", CPUModel: "qemu64", MAC: "52:54:00:12:34:56",
			LedgerPort: true,
		},
		Paths: vmfork.Paths{
			Dir: "/var/lib/vmfork/machines/web", Disk: "/var/lib/vmfork/machines/web/disk.qcow2",
			Serial: "/var/lib/vmfork/machines/web/serial.log", RAMShared: true,
			Ledger: "/var/lib/vmfork/machines/web/ledger.sock",
		},
	}
}

func testChild() *vmfork.Machine {
	c := testMachine()
	c.Name, c.Parent, c.Template = "web-1", "web", "web.1"
	c.Spec.MAC = "52:54:00:ab:cd:ef"
	c.Paths = vmfork.Paths{
		Dir: "/var/lib/vmfork/machines/web-1", Disk: "/var/lib/vmfork/machines/web-1/disk.qcow2",
		Serial: "/var/lib/vmfork/machines/web-1/serial.log", RAM: "/dev/shm/vmfork/web.1.ram",
		Ledger: "/var/lib/vmfork/machines/web-1/ledger.sock",
	}
	return c
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./libvirtdrv -update)", err)
	}
	if got != string(want) {
		t.Errorf("XML differs from %s (rerun with -update and review the diff):\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

func marshal(t *testing.T, d *libvirtxml.Domain) string {
	t.Helper()
	x, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestBootXMLGolden(t *testing.T) {
	kvm := testMachine()
	kvm.Accel = accelKVM
	diskless := testMachine()
	diskless.Spec.Disk = ""
	reproducible := testMachine()
	reproducible.VMGenID = "12253bd4-e42e-4d00-a04b-3d4ce5a4f8cd"
	disks := testMachine()
	disks.Spec.Disks = []vmfork.DiskSpec{
		{ID: "data", File: "/srv/data.qcow2"},
		{ID: "ro", File: "/srv/ro.raw", Fork: vmfork.DiskShared},
		{ID: "scratch", File: "/srv/scratch.qcow2", Fork: vmfork.DiskFresh},
	}
	disks.Paths.Disks = map[string]vmfork.DiskFile{
		"data":    {File: "/var/lib/vmfork/machines/web/xdisk-data.qcow2"},
		"ro":      {File: "/srv/ro.raw", ReadOnly: true, Format: "raw"},
		"scratch": {File: "/var/lib/vmfork/machines/web/xdisk-scratch.qcow2"},
	}
	cases := []struct {
		name string
		m    *vmfork.Machine
	}{
		{"boot-tcg", testMachine()},
		{"boot-kvm", kvm},
		{"boot-diskless", diskless},
		{"boot-vmgenid", reproducible},
		{"boot-disks", disks},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			md := Metadata{Machine: c.m.Name, MachineDir: c.m.Paths.Dir}
			d := BootXML(c.m, md, BootOptions{User: "+0:+0"})
			golden(t, c.name, marshal(t, d)+"\n")
			if err := Check(d); err != nil {
				t.Errorf("a booted domain must be forkable: %v", err)
			}
		})
	}
}

func sourceXML(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "source-migratable.xml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestChildXMLGolden(t *testing.T) {
	c := testChild()
	md := Metadata{Machine: c.Name, MachineDir: c.Paths.Dir, Parent: "web", Template: "web.1", TemplateRAM: c.Paths.RAM}
	d, err := ChildXML(sourceXML(t), c, md)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "child", marshal(t, d)+"\n")
}

// TestChildXMLKeepsDeviceModel checks the rule that makes forking work: a
// child's domain differs from its source's only in backends, never in what
// the guest sees.
func TestChildXMLKeepsDeviceModel(t *testing.T) {
	src := &libvirtxml.Domain{}
	if err := src.Unmarshal(sourceXML(t)); err != nil {
		t.Fatal(err)
	}
	child, err := ChildXML(sourceXML(t), testChild(), Metadata{Machine: "web-1", TemplateRAM: "/dev/shm/vmfork/web.1.ram"})
	if err != nil {
		t.Fatal(err)
	}
	pv, cv := GuestVisible(src), GuestVisible(child)
	if strings.Join(pv, "\n") != strings.Join(cv, "\n") {
		t.Errorf("guest-visible configuration differs:\nsource: %q\nchild:  %q", pv, cv)
	}
	if len(pv) < 12 {
		t.Errorf("only %d guest-visible items found: %q", len(pv), pv)
	}
	if got := child.MemoryBacking.MemoryAccess.Mode; got != "private" {
		t.Errorf("child RAM access = %q, want private", got)
	}
	if child.UUID != "" || child.Name != "web-1" || child.GenID == nil || child.GenID.Value != "" {
		t.Errorf("child name/uuid/genid = %q/%q/%+v, want web-1, none, an empty <genid/>", child.Name, child.UUID, child.GenID)
	}
	if md := metadataOf(child); md == nil || md.TemplateRAM != "/dev/shm/vmfork/web.1.ram" || md.Machine != "web-1" {
		t.Errorf("child metadata = %+v, want its own with the template RAM", md)
	}
	args := child.QEMUCommandline.Args
	var words []string
	for _, a := range args {
		words = append(words, a.Value)
	}
	if got := strings.Join(words, " "); got != "-global migration.announce-rounds=1 -incoming defer" {
		t.Errorf("qemu:commandline = %q, want no announce after the load and -incoming defer", got)
	}
}

func TestChildXMLRefusesWhatItCannotFork(t *testing.T) {
	c := testChild()
	anon := strings.Replace(sourceXML(t), "<source type='file'/>", "", 1)
	if _, err := ChildXML(anon, c, Metadata{}); err == nil || !strings.Contains(err.Error(), "<memoryBacking>") {
		t.Errorf("source without file RAM: err = %v, want one naming <memoryBacking>", err)
	}
	diskless := testChild()
	diskless.Spec.Disk = ""
	if _, err := ChildXML(sourceXML(t), diskless, Metadata{}); err == nil || !strings.Contains(err.Error(), "vda") {
		t.Errorf("child without disk of a source with one: err = %v, want one naming vda", err)
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	md := Metadata{Machine: "a", MachineDir: "/x/<&>/a", Parent: "p", Template: "p.1", TemplateRAM: "/dev/shm/vmfork/p.1.ram"}
	d := &libvirtxml.Domain{Name: "a"}
	setMetadata(d, md)
	x := marshal(t, d)
	back := &libvirtxml.Domain{}
	if err := back.Unmarshal(x); err != nil {
		t.Fatal(err)
	}
	got := metadataOf(back)
	if got == nil || got.Machine != md.Machine || got.MachineDir != md.MachineDir || got.TemplateRAM != md.TemplateRAM || got.Template != md.Template {
		t.Errorf("metadata round trip = %+v, want %+v", got, md)
	}
	// What virDomainGetMetadata returns: the element without its namespace.
	stripped := "<machine><name>a</name><dir>/x/a</dir></machine>"
	if got := parseMetadata(stripped); got == nil || got.MachineDir != "/x/a" {
		t.Errorf("parseMetadata(%q) = %+v", stripped, got)
	}
	if got := metadataOf(&libvirtxml.Domain{Metadata: &libvirtxml.DomainMetadata{XML: "<other:x xmlns:other='urn:other'/>"}}); got != nil {
		t.Errorf("foreign metadata taken for vmfork's: %+v", got)
	}
}

func TestRAMFile(t *testing.T) {
	if got, want := ramFile("/dev/shm/libvirt/qemu", 12, "a-very-long-machine-name-indeed"), "/dev/shm/libvirt/qemu/12-a-very-long-machine-/pc.ram"; got != want {
		t.Errorf("ramFile = %q, want %q (libvirt keeps the first 20 characters)", got, want)
	}
}

// ledgerChannels returns the paths of d's family ledger channels.
func ledgerChannels(d *libvirtxml.Domain) []string {
	var out []string
	for i := range d.Devices.Channels {
		if ch := &d.Devices.Channels[i]; isLedger(ch) {
			p := ""
			if ch.Source != nil && ch.Source.UNIX != nil {
				p = ch.Source.UNIX.Path
			}
			out = append(out, p)
		}
	}
	return out
}

// A booted domain gets the ledger's channel on its machine's socket, a
// machine without the port (made before it) none; a child's channel,
// copied from its source's XML, is moved to the child's own socket.
func TestLedgerChannel(t *testing.T) {
	m := testMachine()
	if got := ledgerChannels(BootXML(m, Metadata{}, BootOptions{})); len(got) != 1 || got[0] != m.Paths.Ledger {
		t.Errorf("booted: ledger channels %q, want one on %s", got, m.Paths.Ledger)
	}
	m.Spec.LedgerPort = false
	if got := ledgerChannels(BootXML(m, Metadata{}, BootOptions{})); len(got) != 0 {
		t.Errorf("booted without the port: ledger channels %q, want none", got)
	}
	c := testChild()
	d, err := ChildXML(sourceXML(t), c, Metadata{Machine: c.Name})
	if err != nil {
		t.Fatal(err)
	}
	if got := ledgerChannels(d); len(got) != 1 || got[0] != c.Paths.Ledger {
		t.Errorf("child: ledger channels %q, want one on %s", got, c.Paths.Ledger)
	}
	vis := strings.Join(GuestVisible(d), "\n")
	if !strings.Contains(vis, "channel org.vmfork.ledger.0 virtio-serial 0.0.2") {
		t.Errorf("the ledger channel is not guest-visible at its source's port:\n%s", vis)
	}
}
