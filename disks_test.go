package vmfork

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/overlay"
)

func TestParseDiskArg(t *testing.T) {
	for _, c := range []struct {
		in   string
		want DiskArg
		bad  string
	}{
		{in: "/srv/os.qcow2", want: DiskArg{File: "/srv/os.qcow2", Policy: DiskCow}},
		{in: "id=data,file=/srv/d.qcow2", want: DiskArg{ID: "data", File: "/srv/d.qcow2", Policy: DiskCow}},
		{in: "id=s,file=/s.img,fork=fresh", want: DiskArg{ID: "s", File: "/s.img", Policy: DiskFresh}},
		{in: "file=/a,fork=keep,id=home", want: DiskArg{ID: "home", File: "/a", Policy: DiskKeep}},
		{in: "id=x,file=/a,fork=copy", bad: "want cow, shared, fresh or keep"},
		{in: "id=x,fork=cow", bad: "file= is required"},
		{in: "id=x,file=/a,size=1G", bad: `unknown option "size"`},
	} {
		got, err := ParseDiskArg(c.in)
		if c.bad != "" {
			if err == nil || !strings.Contains(err.Error(), c.bad) || !errors.Is(err, ErrInvalid) {
				t.Errorf("ParseDiskArg(%q) = %v, want an invalid error saying %q", c.in, err, c.bad)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseDiskArg(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

func TestSetDisks(t *testing.T) {
	var s Spec
	err := s.SetDisks([]DiskArg{
		{ID: "os", File: "/os", Policy: DiskCow},
		{ID: "data", File: "/d", Policy: DiskCow},
		{ID: "scratch", File: "/s", Policy: DiskFresh},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := Spec{Disk: "/os", DiskID: "os", Disks: []DiskSpec{{ID: "data", File: "/d"}, {ID: "scratch", File: "/s", Fork: DiskFresh}}}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("SetDisks = %+v, want %+v", s, want)
	}
	for _, c := range []struct {
		args []DiskArg
		bad  string
	}{
		{[]DiskArg{{File: "/os", Policy: DiskShared}}, "is the boot disk, which forks cow"},
		{[]DiskArg{{File: "/os", Policy: DiskCow}, {File: "/d", Policy: DiskCow}}, "a second disk needs an id"},
	} {
		var s Spec
		if err := s.SetDisks(c.args); err == nil || !strings.Contains(err.Error(), c.bad) || !errors.Is(err, ErrInvalid) {
			t.Errorf("SetDisks(%+v) = %v, want %q", c.args, err, c.bad)
		}
	}
}

func TestValidateDisks(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "d.qcow2")
	if err := overlay.CreateEmpty(context.Background(), 1<<20, img); err != nil {
		t.Fatalf("qemu-img (make deps installs qemu-utils): %v", err)
	}
	for _, c := range []struct {
		s   Spec
		bad string
	}{
		{Spec{Disk: img, Disks: []DiskSpec{{ID: "data", File: img}, {ID: "data", File: img}}}, `disk id "data" is given twice`},
		{Spec{Disk: img, Disks: []DiskSpec{{ID: "disk0", File: img}}}, `disk id "disk0" is given twice`},
		{Spec{Disk: img, DiskID: "os", Disks: []DiskSpec{{ID: "os", File: img}}}, `disk id "os" is given twice`},
		{Spec{Disk: img, Disks: []DiskSpec{{ID: "Data", File: img}}}, `disk id "Data"`},
		{Spec{Disk: img, Disks: []DiskSpec{{ID: "abcdefghijklmnopq", File: img}}}, `disk id "abcdefghijklmnopq"`},
		{Spec{Disks: []DiskSpec{{ID: "data", File: img}}}, "extra disks need a boot disk"},
		{Spec{Disk: img, Disks: []DiskSpec{{ID: "data", File: "rel.qcow2"}}}, "must be absolute"},
		{Spec{Disk: img, Disks: []DiskSpec{{ID: "data", File: filepath.Join(dir, "nope")}}}, "does not exist"},
		{Spec{Disk: img, Disks: []DiskSpec{{ID: "data", File: img, Fork: "copy"}}}, `disk policy "copy"`},
	} {
		if err := c.s.validateDisks(); err == nil || !strings.Contains(err.Error(), c.bad) || !errors.Is(err, ErrInvalid) {
			t.Errorf("validateDisks(%+v) = %v, want %q", c.s, err, c.bad)
		}
	}
	ok := Spec{Disk: img, DiskID: "os", Disks: []DiskSpec{{ID: "data", File: img}, {ID: "scratch", File: img, Fork: DiskFresh}}}
	if err := ok.validateDisks(); err != nil {
		t.Errorf("validateDisks(%+v) = %v", ok, err)
	}
}

func TestDiskPolicies(t *testing.T) {
	got, err := ParseDiskPolicies([]string{"data=fresh", "scratch=keep"})
	if err != nil || !reflect.DeepEqual(got, map[string]DiskPolicy{"data": DiskFresh, "scratch": DiskKeep}) {
		t.Fatalf("ParseDiskPolicies = %v, %v", got, err)
	}
	for _, in := range [][]string{{"data"}, {"=cow"}, {"data=copy"}, {"data=cow", "data=fresh"}} {
		if _, err := ParseDiskPolicies(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseDiskPolicies(%q) = %v, want invalid", in, err)
		}
	}
	s := Spec{Disk: "/os", Disks: []DiskSpec{{ID: "data", File: "/d"}}}
	for _, c := range []struct {
		o   map[string]DiskPolicy
		bad string
	}{
		{map[string]DiskPolicy{"nope": DiskCow}, `no disk "nope" (the machine's disks: disk0, data)`},
		{map[string]DiskPolicy{"disk0": DiskFresh}, "is the boot disk, which forks cow"},
	} {
		if err := CheckDiskPolicies(s, c.o); err == nil || !strings.Contains(err.Error(), c.bad) || !errors.Is(err, ErrInvalid) {
			t.Errorf("CheckDiskPolicies(%v) = %v, want %q", c.o, err, c.bad)
		}
	}
	if err := CheckDiskPolicies(s, map[string]DiskPolicy{"disk0": DiskCow, "data": DiskShared}); err != nil {
		t.Errorf("CheckDiskPolicies = %v", err)
	}
}

// TestOldRecordLoads: a record written before machines had several disks
// (no disk_id, no disks) loads as the one boot disk it had, forking cow,
// and is written back the same.
func TestOldRecordLoads(t *testing.T) {
	s := newTestStore(t)
	p := s.MachinePaths("old")
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	old := `{"name":"old","driver":"qemu","state":"stopped","spec":{"disk":"/srv/os.qcow2","memory_mib":256,"cpus":1,"network":{}},
"paths":{"dir":"` + p.Dir + `","disk":"` + p.Disk + `","qmp_socket":"q","qga_socket":"g","serial_log":"s","qemu_log":"l","ram_file":"r","ram_shared":true},"created":"2026-01-01T00:00:00Z"}`
	if err := os.WriteFile(filepath.Join(p.Dir, fileMachine), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := s.LoadMachine("old")
	if err != nil {
		t.Fatal(err)
	}
	want := []DiskInfo{{ID: BootDiskID, Base: "/srv/os.qcow2", Top: p.Disk, Fork: DiskCow, Boot: true}}
	if got := m.DiskList(); !reflect.DeepEqual(got, want) {
		t.Errorf("DiskList = %+v, want %+v", got, want)
	}
	if err := s.SaveMachine(m); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(p.Dir, fileMachine))
	var raw map[string]map[string]any
	json.Unmarshal(data, &raw)
	for _, k := range []string{"disk_id", "disks"} {
		if _, ok := raw["spec"][k]; ok {
			t.Errorf("rewritten old record has spec.%s: %s", k, data)
		}
	}
}

// TestTemplateAndChildDisks plans a template's disks from a source with
// one disk of each policy and makes a child's: cow an overlay on the
// frozen image, shared the read-only image, fresh and keep empty disks
// with a marker.
func TestTemplateAndChildDisks(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	if err := overlay.CreateEmpty(ctx, 2<<20, base); err != nil {
		t.Fatalf("qemu-img (make deps installs qemu-utils): %v", err)
	}
	src := &Machine{Name: "src", Spec: Spec{Disk: base, Disks: []DiskSpec{
		{ID: "data", File: base}, {ID: "ro", File: base, Fork: DiskShared},
		{ID: "scratch", File: base, Fork: DiskFresh}, {ID: "home", File: base, Fork: DiskKeep},
	}}, Paths: Paths{Dir: filepath.Join(dir, "src")}}
	os.Mkdir(src.Paths.Dir, 0o700)
	if err := PrepareDisks(ctx, src); err != nil {
		t.Fatal(err)
	}
	if f := src.Paths.Disks["ro"]; f.File != base || !f.ReadOnly {
		t.Errorf("shared disk = %+v, want %s read-only", f, base)
	}
	tpl := &Template{Paths: TemplatePaths{Dir: filepath.Join(dir, "tpl")}}
	os.Mkdir(tpl.Paths.Dir, 0o700)
	if err := planTemplateDisks(src, tpl, map[string]DiskPolicy{"data": DiskCow}); err != nil {
		t.Fatal(err)
	}
	frozen := map[string]bool{}
	for _, d := range tpl.Disks {
		frozen[d.ID] = d.Frozen()
		if d.Size != 2<<20 {
			t.Errorf("disk %s size %d, want %d", d.ID, d.Size, 2<<20)
		}
	}
	if !reflect.DeepEqual(frozen, map[string]bool{"data": true, "ro": false, "scratch": false, "home": false}) {
		t.Errorf("frozen = %v", frozen)
	}
	// Stand in for the freeze: the frozen image is the source's top.
	if err := os.Link(src.Paths.Disks["data"].File, tpl.Disks[0].File); err != nil {
		t.Fatal(err)
	}
	c := &Machine{Name: "c", Spec: src.Spec, Paths: Paths{Dir: filepath.Join(dir, "c")}}
	os.Mkdir(c.Paths.Dir, 0o700)
	if err := childDisks(ctx, tpl, c); err != nil {
		t.Fatal(err)
	}
	if chain, err := overlay.Chain(c.Paths.Disks["data"].File); err != nil || len(chain) != 3 || !overlay.SameFile(chain[1].Path, tpl.Disks[0].File) {
		t.Errorf("child's data chain = %+v, %v; want overlay, frozen, base", chain, err)
	}
	if f := c.Paths.Disks["ro"]; f.File != base || !f.ReadOnly {
		t.Errorf("child's shared disk = %+v", f)
	}
	for _, id := range []string{"scratch", "home"} {
		chain, err := overlay.Chain(c.Paths.Disks[id].File)
		if err != nil || len(chain) != 1 || chain[0].VirtualSize != 2<<20 {
			t.Errorf("child's %s = %+v, %v; want one empty 2 MiB image", id, chain, err)
		}
	}
	if got, want := FreshDiskMarkers(tpl), []string{"VMFORK_DISK_SCRATCH=fresh", "VMFORK_DISK_HOME=fresh"}; !reflect.DeepEqual(got, want) {
		t.Errorf("markers = %q, want %q", got, want)
	}
	if &c.Spec.Disks[0] == &src.Spec.Disks[0] {
		t.Error("child shares its source's disk list")
	}
}

// TestExportImportExtraDisks: a template's extra disk images travel
// flattened in its archive and land in the imported template's directory;
// a fresh or keep disk travels as its size alone.
func TestExportImportExtraDisks(t *testing.T) {
	mg, _ := newTestManager(t)
	tpl := keptFake(t, mg)
	ctx := t.Context()
	base := filepath.Join(t.TempDir(), "base.qcow2")
	if err := overlay.CreateEmpty(ctx, 1<<20, base); err != nil {
		t.Fatalf("qemu-img (make deps installs qemu-utils): %v", err)
	}
	frozen := filepath.Join(tpl.Paths.Dir, "disk-data.qcow2")
	if err := overlay.Create(ctx, base, frozen); err != nil {
		t.Fatal(err)
	}
	tpl.Spec.Disks = []DiskSpec{{ID: "data", File: base}, {ID: "home", File: base, Fork: DiskKeep}}
	tpl.Disks = []TemplateDisk{{ID: "data", Policy: DiskCow, File: frozen, Owned: true, Size: 1 << 20}, {ID: "home", Policy: DiskKeep, Size: 1 << 20}}
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "golden.vmt")
	if _, err := mg.Export(ctx, ExportRequest{Name: "golden", File: file}); err != nil {
		t.Fatal(err)
	}
	other, _ := newTestManager(t)
	if _, err := other.Import(ctx, ImportRequest{File: file, As: "copy"}); err != nil {
		t.Fatal(err)
	}
	got, err := other.Store.FindKept("copy")
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(got.Paths.Dir, "disk-data.qcow2")
	if d := got.Disks[0]; d.File != want || !d.Owned {
		t.Errorf("imported data disk = %+v, want owned %s", d, want)
	}
	if chain, err := overlay.Chain(want); err != nil || len(chain) != 1 || chain[0].VirtualSize != 1<<20 {
		t.Errorf("imported data image = %+v, %v; want one flat 1 MiB image", chain, err)
	}
	if d := got.Disks[1]; d.File != "" || d.Size != 1<<20 || d.Policy != DiskKeep {
		t.Errorf("imported keep disk = %+v, want its size only", d)
	}
}

// TestCollectKeepsATemplateAnExtraDiskReads: a template no child maps and
// whose boot disk no chain reads stays while a stopped machine's extra
// disk is an overlay on its frozen image, and goes once that is gone.
func TestCollectKeepsATemplateAnExtraDiskReads(t *testing.T) {
	mg, _ := newTestManager(t)
	ctx := t.Context()
	base, err := os.ReadFile(filepath.Join("overlay", "testdata", "base.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := mg.Store.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	frozen := templateDiskFile(tpl.Paths.Dir, "data")
	for _, f := range []string{tpl.Paths.Disk, frozen} {
		if err := os.WriteFile(f, base, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tpl.Disks = []TemplateDisk{{ID: "data", Policy: DiskCow, File: frozen, Owned: true}}
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	m := &Machine{Name: "m", Driver: "fake", State: StateStopped, Paths: mg.Store.MachinePaths("m"),
		Spec: Spec{Disk: "/base", Disks: []DiskSpec{{ID: "data", File: "/base"}}}}
	if err := mg.Store.CreateMachine(m); err != nil {
		t.Fatal(err)
	}
	// Its boot disk reads nothing of the template; its data disk does.
	if err := os.WriteFile(m.Paths.Disk, base, 0o644); err != nil {
		t.Fatal(err)
	}
	top := filepath.Join(m.Paths.Dir, diskTopName("data"))
	if err := overlay.Create(ctx, frozen, top); err != nil {
		t.Fatal(err)
	}
	m.Paths.Disks = map[string]DiskFile{"data": {File: top}}
	if err := mg.Store.SaveMachine(m); err != nil {
		t.Fatal(err)
	}
	mg.collectTemplates(ctx)
	if _, err := mg.Store.LoadTemplate(tpl.ID); err != nil {
		t.Fatalf("template removed while an extra disk's chain reads it: %v", err)
	}
	if err := mg.Store.RemoveMachine("m"); err != nil {
		t.Fatal(err)
	}
	mg.collectTemplates(ctx)
	if _, err := mg.Store.LoadTemplate(tpl.ID); err == nil {
		t.Errorf("template left after the last chain reading it went")
	}
}

// cowOnlyDisks is a driver that boots and forks extra disks but honours
// only cow.
type cowOnlyDisks struct{ *fakeDriver }

func (cowOnlyDisks) DiskPolicies() []DiskPolicy { return []DiskPolicy{DiskCow} }
func (cowOnlyDisks) BootsDisks() bool           { return true }

// A disk or policy the driver cannot honour is refused in one line naming
// the driver, the disk and the policy, as bad input.
func TestCheckDiskSupport(t *testing.T) {
	s := Spec{Disk: "/srv/os.qcow2", Disks: []DiskSpec{{ID: "data", File: "/srv/data.qcow2"}, {ID: "home", File: "/srv/home.qcow2", Fork: DiskKeep}}}
	fd := &fakeDriver{}
	for _, c := range []struct {
		name     string
		drv      Driver
		override map[string]DiskPolicy
		boots    bool
		want     string
	}{
		{"no multi-disk driver", fd, nil, false, `driver "fake" cannot boot a machine with more than one disk (disk "data")`},
		{"policy at boot", cowOnlyDisks{fd}, nil, true, `driver "fake" cannot honour policy keep of disk "home"`},
		{"policy per fork", cowOnlyDisks{fd}, map[string]DiskPolicy{"home": DiskCow, "data": DiskFresh}, false, `driver "fake" cannot honour policy fresh of disk "data"`},
	} {
		mg := &Manager{Driver: c.drv}
		err := mg.checkDiskSupport(s, c.override, c.boots)
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid %q", c.name, err, c.want)
		}
	}
	mg := &Manager{Driver: cowOnlyDisks{fd}}
	if err := mg.checkDiskSupport(s, map[string]DiskPolicy{"home": DiskCow}, true); err != nil {
		t.Errorf("cow everywhere on a cow-only driver: %v", err)
	}
}

// TestCheckDiskSupportBlock: a disk on a block device is refused, before
// anything changes, by a driver that cannot open one (the libvirt driver
// describes every disk as a file), and taken by one that can.
func TestCheckDiskSupportBlock(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "blk")
	if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 200))); err != nil {
		t.Skipf("make a block device node (needs CAP_MKNOD): %v", err)
	}
	s := Spec{Disk: "/srv/os.qcow2", Disks: []DiskSpec{{ID: "data", File: dev}}}
	mg := &Manager{Driver: cowOnlyDisks{&fakeDriver{}}}
	err := mg.checkDiskSupport(s, nil, true)
	want := `driver "fake" cannot run disk "data" on block device ` + dev
	if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), BlockDisksDoc) {
		t.Errorf("block disk on a driver without BlockDisks: %v, want ErrInvalid %q", err, want)
	}
	mg.Driver = blockDisks{cowOnlyDisks{&fakeDriver{}}}
	if err := mg.checkDiskSupport(s, nil, true); err != nil {
		t.Errorf("block disk on a driver with BlockDisks: %v", err)
	}
}

// blockDisks is a driver that runs disks on block devices.
type blockDisks struct{ cowOnlyDisks }

func (blockDisks) BlockDisks() bool { return true }
