//go:build cgo

package libvirtdrv

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
)

const forkableMemory = "<memoryBacking><source type='file'/><access mode='shared'/></memoryBacking>"

// operatorXML is a domain as an operator might define it with virsh, for
// libvirt's test driver: no vmfork metadata, no seclabel.
func operatorXML(name, memory, balloon, disk string) string {
	return `<domain type='test'><name>` + name + `</name><memory unit='KiB'>262144</memory><vcpu>2</vcpu><genid/>` + memory +
		`<os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type><kernel>/srv/vmlinuz</kernel></os><devices>` +
		`<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='` + disk + `'/><target dev='vda' bus='virtio'/></disk>` +
		`<disk type='file' device='cdrom'><target dev='sda' bus='sata'/><readonly/></disk>` +
		`<interface type='user'><mac address='52:54:00:12:34:56'/><model type='virtio'/></interface>` +
		`<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>` + balloon + `</devices></domain>`
}

// defineTestDomain defines domain x in the test driver and starts it unless
// stopped is set.
func defineTestDomain(t *testing.T, d *Driver, x string, stopped bool) {
	t.Helper()
	dom, err := d.conn.DomainDefineXML(x)
	if err != nil {
		t.Fatalf("define: %v", wrap(err))
	}
	defer dom.Free()
	if !stopped {
		if err := dom.Create(); err != nil {
			t.Fatalf("start: %v", wrap(err))
		}
	}
}

func TestAdopt(t *testing.T) {
	d := testDriver(t)
	ctx := t.Context()
	paths := vmfork.Paths{Dir: filepath.Join(t.TempDir(), "machines", "ops-web")}
	defineTestDomain(t, d, operatorXML("ops-web", forkableMemory, "<memballoon model='none'/>", "/srv/images/web.qcow2"), false)
	m, err := d.Adopt(ctx, "ops-web", paths)
	if err != nil {
		t.Fatalf("Adopt = %v, want a record", err)
	}
	if m.Adopted == nil || len(m.Adopted.ID) != 36 || m.Adopted.Disk != "/srv/images/web.qcow2" {
		t.Errorf("Adopted = %+v, want the domain's uuid and its disk", m.Adopted)
	}
	s := m.Spec
	if m.Driver != Name || m.State != vmfork.StateRunning || s.MemoryMiB != 256 || s.CPUs != 2 || s.MachineType != "pc-q35-7.2" ||
		s.MAC != "52:54:00:12:34:56" || s.Disk != "/srv/images/web.qcow2" || m.Paths.Disk != s.Disk || !m.Paths.RAMShared {
		t.Errorf("record = %+v, want the domain as it is", m)
	}
	// The record names the domain by uuid: vmfork sees it as running,
	// though it carries no vmfork metadata.
	if st, err := d.Status(ctx, m); err != nil || st != vmfork.StateRunning {
		t.Errorf("Status of the adopted domain = %s, %v; want running", st, err)
	}
	other := *m
	other.Adopted = &vmfork.Adoption{ID: "00000000-0000-4000-8000-000000000000"}
	if st, _ := d.Status(ctx, &other); st != vmfork.StateStopped {
		t.Errorf("Status of another domain of that name = %s, want stopped", st)
	}
	// Its disk is outside the state dir: nothing of vmfork's is used.
	if err := d.Disown(ctx, m); err != nil {
		t.Errorf("Disown = %v, want nil", err)
	}
}

func TestAdoptRefusals(t *testing.T) {
	d := testDriver(t)
	ctx := t.Context()
	paths := vmfork.Paths{Dir: filepath.Join(t.TempDir(), "machines", "x")}
	none := "<memballoon model='none'/>"
	defineTestDomain(t, d, operatorXML("anon", "", none, "/srv/a.qcow2"), false)
	defineTestDomain(t, d, operatorXML("balloon", forkableMemory, "<memballoon model='virtio'/>", "/srv/b.qcow2"), false)
	defineTestDomain(t, d, operatorXML("off", forkableMemory, none, "/srv/c.qcow2"), true)
	defineTestDomain(t, d, strings.Replace(operatorXML("marked", forkableMemory, none, "/srv/d.qcow2"), "<genid/>",
		"<genid/><metadata>"+Metadata{Machine: "marked", MachineDir: "/var/lib/vmfork/machines/marked"}.element()+"</metadata>", 1), false)
	cases := []struct {
		name string
		is   error
		says string
	}{
		{"anon", vmfork.ErrUnsupported, "<memoryBacking><source type='file'/>"},
		{"balloon", vmfork.ErrUnsupported, "<memballoon model='virtio'>"},
		{"off", vmfork.ErrNotRunning, "virsh start off"},
		{"marked", vmfork.ErrInvalid, "/var/lib/vmfork/machines/marked"},
		{"absent", vmfork.ErrNotFound, "no libvirt domain"},
	}
	for _, c := range cases {
		m, err := d.Adopt(ctx, c.name, paths)
		if m != nil || !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Adopt(%s) = %v, %v; want an error wrapping %v that says %s", c.name, m, err, c.is, c.says)
		}
	}
}

func TestDisownWhileTheDomainUsesTheStateDir(t *testing.T) {
	d := testDriver(t)
	ctx := t.Context()
	state := t.TempDir()
	paths := vmfork.Paths{Dir: filepath.Join(state, "machines", "ops-db")}
	overlay := filepath.Join(paths.Dir, "disk.1.qcow2")
	defineTestDomain(t, d, operatorXML("ops-db", forkableMemory, "<memballoon model='none'/>", overlay), false)
	m, err := d.Adopt(ctx, "ops-db", paths)
	if err != nil {
		t.Fatal(err)
	}
	m.Adopted.Disk = "/srv/images/db.qcow2"
	err = d.Disown(ctx, m)
	for _, want := range []string{overlay, "virsh blockcommit ops-db vda --base /srv/images/db.qcow2 --active --pivot"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Disown = %v, want it to name %s", err, want)
		}
	}
	dom, err := d.conn.LookupDomainByName("ops-db")
	if err != nil {
		t.Fatal(err)
	}
	defer dom.Free()
	if err := dom.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := dom.Undefine(); err != nil {
		t.Fatal(err)
	}
	if err := d.Disown(ctx, m); err != nil {
		t.Errorf("Disown of a domain that is gone = %v, want nil", err)
	}
}

func TestFreezeForeign(t *testing.T) {
	user := t.TempDir()
	copyFile(t, "../overlay/testdata/base.qcow2", filepath.Join(user, "base.qcow2"))
	copyFile(t, "../overlay/testdata/top.qcow2", filepath.Join(user, "top.qcow2")) // backing "base.qcow2", relative
	tpl := func() *vmfork.Template {
		dir := t.TempDir()
		return &vmfork.Template{ID: "web.1", Paths: vmfork.TemplatePaths{Dir: dir, Disk: filepath.Join(dir, "disk.qcow2")}}
	}

	// Same file system, absolute or no backing file: a hard link.
	linked := tpl()
	if err := freezeForeign(filepath.Join(user, "base.qcow2"), linked); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(user, "base.qcow2"))
	b, err := os.Stat(linked.Paths.Disk)
	if err != nil || !os.SameFile(a, b) || linked.ForeignDisk {
		t.Errorf("template disk %s (%v), foreign %v: want a hard link to the image", linked.Paths.Disk, err, linked.ForeignDisk)
	}

	// A relative backing file would resolve from the template's directory.
	rel := tpl()
	if err := freezeForeign(filepath.Join(user, "top.qcow2"), rel); err != nil {
		t.Fatal(err)
	}
	if rel.Paths.Disk != filepath.Join(user, "top.qcow2") || !rel.ForeignDisk {
		t.Errorf("template disk %s, foreign %v: want the image where it is", rel.Paths.Disk, rel.ForeignDisk)
	}

	// Another file system: no link can be made (EXDEV).
	shm, err := os.MkdirTemp("/dev/shm", "vmfork-unit-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(shm)
	if sameDevice(t, shm, user) {
		t.Log("/dev/shm and the test's temp dir are one file system: EXDEV not exercised")
		return
	}
	far := filepath.Join(shm, "far.qcow2")
	copyFile(t, "../overlay/testdata/base.qcow2", far)
	x := tpl()
	if err := freezeForeign(far, x); err != nil {
		t.Fatal(err)
	}
	if x.Paths.Disk != far || !x.ForeignDisk {
		t.Errorf("template disk %s, foreign %v: want the image where it is", x.Paths.Disk, x.ForeignDisk)
	}
}
