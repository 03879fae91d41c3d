package vmfork

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmfork/vmfork/internal/testloop"
	"github.com/vmfork/vmfork/overlay"
)

// loopDevice makes a loop device of size bytes, detached at the end of
// the test (internal/testloop). Loop devices need root and the loop
// driver: without them the test is skipped, saying which.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	dev, _, err := testloop.New(t, size)
	if err != nil {
		t.Skip(err)
	}
	return dev
}

func TestRefuseNetworkDisk(t *testing.T) {
	for _, p := range []string{"rbd:pool/image", "RBD:pool/image:conf=/etc/ceph.conf", "iscsi://10.0.0.1/iqn.2001-04.com.example:disk/0",
		"nbd:localhost:10809", "nbd+unix:///exp?socket=/run/nbd.sock", "gluster://h/v/img", "https://example.com/disk.qcow2", "ssh://u@h/disk.img", "ftp://h/d"} {
		err := refuseNetworkDisk("disk data", p)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), BlockDisksDoc) || !strings.Contains(err.Error(), p) {
			t.Errorf("refuseNetworkDisk(%q) = %v, want an invalid error naming it and %s", p, err, BlockDisksDoc)
		}
	}
	for _, p := range []string{"/srv/data.qcow2", "/dev/vg0/data", "rel/rbd:x"} {
		if err := refuseNetworkDisk("disk data", p); err != nil {
			t.Errorf("refuseNetworkDisk(%q) = %v, want nil", p, err)
		}
	}
	// On the command line, before the CLI makes the path absolute.
	for _, arg := range []string{"rbd:pool/os", "id=data,file=nbd:h:10809", "id=data,file=https://h/d.qcow2,fork=shared"} {
		if _, err := ParseDiskArg(arg); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), BlockDisksDoc) {
			t.Errorf("ParseDiskArg(%q) = %v, want a network disk refused", arg, err)
		}
	}
	// Both the boot disk and an extra disk, before anything else.
	img := filepath.Join(t.TempDir(), "d.raw")
	if err := os.WriteFile(img, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, s := range []Spec{
		{Disk: "rbd:pool/os", MemoryMiB: 128, CPUs: 1},
		{Disk: img, Disks: []DiskSpec{{ID: "data", File: "iscsi://h/iqn/1"}}, MemoryMiB: 128, CPUs: 1},
	} {
		if err := s.Validate(); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "network disk") && !strings.Contains(err.Error(), "is a URL") {
			t.Errorf("Validate(%+v) = %v, want a network disk refused", s, err)
		}
	}
}

// TestBlockDiskValidateAndPrepare: a block device is taken as an extra
// disk (its size is the device's, not stat's 0), refused as the boot
// disk, and a machine writes to it in place until its first fork.
func TestBlockDiskValidateAndPrepare(t *testing.T) {
	ctx := context.Background()
	dev := loopDevice(t, 4<<20)
	dir := t.TempDir()
	img := filepath.Join(dir, "os.qcow2")
	if err := overlay.CreateEmpty(ctx, 1<<20, img); err != nil {
		t.Fatalf("qemu-img (make deps installs qemu-utils): %v", err)
	}
	if err := overlay.CheckBase(dev); err != nil {
		t.Errorf("CheckBase(%s) = %v", dev, err)
	}
	if chain, err := overlay.Chain(dev); err != nil || len(chain) != 1 || chain[0].Format != "raw" || chain[0].VirtualSize != 4<<20 {
		t.Errorf("Chain(%s) = %+v, %v; want one raw layer of 4 MiB", dev, chain, err)
	}
	s := Spec{Disk: img, Disks: []DiskSpec{{ID: "data", File: dev}}}
	if err := s.validateDisks(); err != nil {
		t.Errorf("validateDisks with block disk %s = %v", dev, err)
	}
	boot := Spec{Disk: dev, MemoryMiB: 128, CPUs: 1}
	if err := boot.Validate(); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "is a block device: only extra disks") {
		t.Errorf("Validate with a block boot disk = %v, want it refused", err)
	}

	m := &Machine{Name: "src", Spec: Spec{Disk: img, Disks: []DiskSpec{
		{ID: "data", File: dev}, {ID: "ro", File: dev, Fork: DiskShared}, {ID: "scratch", File: dev, Fork: DiskFresh},
	}}, Paths: Paths{Dir: filepath.Join(dir, "src")}}
	os.Mkdir(m.Paths.Dir, 0o700)
	if err := PrepareDisks(ctx, m); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]DiskFile{
		"data":    {File: dev, Format: "raw", Block: true},
		"ro":      {File: dev, Format: "raw", Block: true, ReadOnly: true},
		"scratch": {File: dev, Format: "raw", Block: true},
	} {
		if got := m.Paths.Disks[id]; got != want {
			t.Errorf("disk %s = %+v, want %+v (the device, in place)", id, got, want)
		}
	}

	// The fork plan: cow and shared freeze the device where it is; fresh
	// leaves it the source's; the shared-at-boot one is read-only already.
	tpl := &Template{Paths: TemplatePaths{Dir: filepath.Join(dir, "tpl")}}
	os.Mkdir(tpl.Paths.Dir, 0o700)
	if err := planTemplateDisks(m, tpl, nil); err != nil {
		t.Fatal(err)
	}
	want := []TemplateDisk{
		{ID: "data", Policy: DiskCow, File: dev, Foreign: true, Format: "raw", Size: 4 << 20},
		{ID: "ro", Policy: DiskShared, File: dev, Format: "raw", Size: 4 << 20},
		{ID: "scratch", Policy: DiskFresh, Size: 4 << 20},
	}
	for i, w := range want {
		if tpl.Disks[i] != w {
			t.Errorf("template disk %d = %+v, want %+v", i, tpl.Disks[i], w)
		}
	}

	// A child: an overlay on the device for cow, the device read-only
	// (host_device) for shared.
	c := &Machine{Name: "c", Spec: m.Spec, Paths: Paths{Dir: filepath.Join(dir, "c")}}
	os.Mkdir(c.Paths.Dir, 0o700)
	if err := childDisks(ctx, tpl, c); err != nil {
		t.Fatal(err)
	}
	if chain, err := overlay.Chain(c.Paths.Disks["data"].File); err != nil || len(chain) != 2 || chain[1].Path != dev || chain[1].Format != "raw" {
		t.Errorf("child's data chain = %+v, %v; want its overlay on %s (raw)", chain, err, dev)
	}
	if f := c.Paths.Disks["ro"]; f != (DiskFile{File: dev, Format: "raw", ReadOnly: true, Block: true}) {
		t.Errorf("child's shared disk = %+v, want the device read-only", f)
	}

	// A stopped source's freeze: the device stays, the source goes on an
	// overlay in its own directory.
	if err := freezeStoppedDisks(ctx, m, tpl); err != nil {
		t.Fatal(err)
	}
	top := m.Paths.Disks["data"].File
	if filepath.Dir(top) != m.Paths.Dir {
		t.Errorf("source's data disk after the freeze = %s, want an overlay in %s", top, m.Paths.Dir)
	}
	if chain, err := overlay.Chain(top); err != nil || len(chain) != 2 || chain[1].Path != dev {
		t.Errorf("source's data chain = %+v, %v; want its overlay on %s", chain, err, dev)
	}
	if f := m.Paths.Disks["scratch"]; f.File != dev || !f.Block {
		t.Errorf("source's fresh block disk after the freeze = %+v, want the device in place", f)
	}
}

// TestBlockDiskDryRun: --dry-run says per block disk what the fork does.
func TestBlockDiskDryRun(t *testing.T) {
	src := &Machine{Name: "src", Spec: Spec{Disk: "/os.qcow2", Disks: []DiskSpec{
		{ID: "data", File: "/dev/vg0/data"}, {ID: "ro", File: "/dev/vg0/ro", Fork: DiskShared},
		{ID: "home", File: "/dev/vg0/home", Fork: DiskKeep}, {ID: "files", File: "/srv/f.qcow2"},
	}}, Paths: Paths{Disks: map[string]DiskFile{
		"data":  {File: "/dev/vg0/data", Block: true, Format: "raw"},
		"ro":    {File: "/dev/vg0/ro", Block: true, ReadOnly: true, Format: "raw"},
		"home":  {File: "/dev/vg0/home", Block: true, Format: "raw"},
		"files": {File: "/s/machines/src/xdisk-files.qcow2"},
	}}}
	p := &forkPlan{mode: forkLive, source: src}
	out := &Plan{}
	p.renderDisks(out)
	got := strings.Join(out.Actions, "\n")
	for _, want := range []string{
		`disk "data": cow, block device /dev/vg0/data frozen in the same pause: it becomes the read-only base, never written again until vmfork disk commit`,
		`disk "ro": shared, block device /dev/vg0/ro read-only already`,
		`disk "home": keep, block device /dev/vg0/home stays the source's, written in place; each child gets an empty disk`,
		`disk "files": cow, frozen in the same pause; each child writes to its own overlay`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("dry run does not say %q:\n%s", want, got)
		}
	}
	// A source already on an overlay over its device forks like a file disk.
	src.Paths.Disks["data"] = DiskFile{File: "/s/machines/src/xdisk-data.1.qcow2"}
	out = &Plan{}
	p.renderDisks(out)
	if got := strings.Join(out.Actions, "\n"); !strings.Contains(got, `disk "data": cow, frozen in the same pause; each child writes to its own overlay`) {
		t.Errorf("dry run of a block disk on its overlay:\n%s", got)
	}
}

// TestCommitDisk: a commit is refused while the machine runs, while
// another machine or a kept template reads the device, and then puts the
// overlay's data on the device and the machine back on it.
func TestCommitDisk(t *testing.T) {
	ctx := t.Context()
	dev := loopDevice(t, 4<<20)
	mg, drv := newTestManager(t)
	base, err := os.ReadFile(filepath.Join("overlay", "testdata", "base.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	mk := func(name string) *Machine {
		m := &Machine{Name: name, Driver: "fake", State: StateStopped, Paths: mg.Store.MachinePaths(name),
			Spec: Spec{Disk: "/base", Disks: []DiskSpec{{ID: "data", File: dev}}}}
		if err := mg.Store.CreateMachine(m); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(m.Paths.Disk, base, 0o644); err != nil {
			t.Fatal(err)
		}
		top := filepath.Join(m.Paths.Dir, "xdisk-data.1.qcow2")
		if err := overlay.Create(ctx, dev, top); err != nil {
			t.Fatal(err)
		}
		m.Paths.Disks = map[string]DiskFile{"data": {File: top}}
		if err := mg.Store.SaveMachine(m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	src, other := mk("src"), mk("other")
	top := src.Paths.Disks["data"].File
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 64k", top).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io (qemu-utils): %v: %s", err, out)
	}
	refused := func(id, says string) {
		t.Helper()
		_, err := mg.CommitDisk(ctx, "src", id)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), says) || strings.Contains(err.Error(), "\n") {
			t.Errorf("CommitDisk(src, %q) = %v, want one invalid line saying %q", id, err, says)
		}
		if got := readDev(t, dev, 4); !bytes.Equal(got, make([]byte, 4)) {
			t.Errorf("a refused commit wrote %x to the device", got)
		}
	}
	refused("", `machine "other" still reads `+dev)
	refused("nope", `no disk "nope"`)
	if err := mg.Store.RemoveMachine(other.Name); err != nil {
		t.Fatal(err)
	}
	tpl, err := mg.Store.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	tpl.Name = "golden"
	tpl.Disks = []TemplateDisk{{ID: "data", Policy: DiskCow, File: dev, Foreign: true, Format: "raw"}}
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	refused("data", `template `+tpl.ID+` still has `+dev+` as its base: it is kept as "golden"`)
	if err := mg.Store.RemoveTemplate(tpl.ID); err != nil {
		t.Fatal(err)
	}
	drv.mu.Lock()
	drv.running["src"] = true
	drv.mu.Unlock()
	refused("data", "machine is running: stop it first")
	drv.mu.Lock()
	delete(drv.running, "src")
	drv.mu.Unlock()

	res, err := mg.CommitDisk(ctx, "src", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].ID != "data" || res[0].Device != dev || len(res[0].Layers) != 1 || res[0].Layers[0] != top {
		t.Errorf("CommitDisk = %+v, want data's one overlay %s onto %s", res, top, dev)
	}
	if got := readDev(t, dev, 64<<10); !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, 64<<10)) {
		t.Errorf("the device does not hold the overlay's writes after the commit")
	}
	m, err := mg.Store.LoadMachine("src")
	if err != nil {
		t.Fatal(err)
	}
	if f := m.Paths.Disks["data"]; f != (DiskFile{File: dev, Format: "raw", Block: true}) {
		t.Errorf("after the commit the disk is %+v, want the device in place", f)
	}
	if _, err := os.Stat(top); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the committed overlay %s is still there: %v", top, err)
	}
	// Again: nothing to commit.
	if res, err := mg.CommitDisk(ctx, "src", "data"); err != nil || len(res) != 1 || len(res[0].Layers) != 0 {
		t.Errorf("second CommitDisk = %+v, %v; want nothing committed", res, err)
	}
}

func readDev(t *testing.T, dev string, n int) []byte {
	t.Helper()
	return testloop.Bytes(t, dev, 0, n)
}

// TestBlockDiskOneMachine: a block device is one machine's (and its
// family's): a boot that gives it again, to itself or beside another
// machine that has it, is refused; read-only shared views may be many.
func TestBlockDiskOneMachine(t *testing.T) {
	dev := loopDevice(t, 1<<20)
	mg, _ := newTestManager(t)
	twice := Spec{Disks: []DiskSpec{{ID: "a", File: dev}, {ID: "b", File: dev, Fork: DiskShared}}}
	if err := mg.checkBlockDisksFree(twice); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `is disk "a" too`) {
		t.Errorf("one device twice = %v, want it refused", err)
	}
	if err := mg.checkBlockDisksFree(Spec{Disks: []DiskSpec{{ID: "data", File: dev}}}); err != nil {
		t.Errorf("a free device = %v", err)
	}
	m := &Machine{Name: "a", Driver: "fake", State: StateStopped, Paths: mg.Store.MachinePaths("a"),
		Spec: Spec{Disk: "/base", Disks: []DiskSpec{{ID: "data", File: dev}}}}
	if err := mg.Store.CreateMachine(m); err != nil {
		t.Fatal(err)
	}
	for _, pol := range []DiskPolicy{DiskCow, DiskShared, DiskKeep} {
		err := mg.checkBlockDisksFree(Spec{Disks: []DiskSpec{{ID: "x", File: dev, Fork: pol}}})
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `is machine "a"'s disk "data" already`) {
			t.Errorf("%s disk on machine a's device = %v, want it refused", pol, err)
		}
	}
	m.Spec.Disks[0].Fork = DiskShared
	if err := mg.Store.SaveMachine(m); err != nil {
		t.Fatal(err)
	}
	if err := mg.checkBlockDisksFree(Spec{Disks: []DiskSpec{{ID: "x", File: dev, Fork: DiskShared}}}); err != nil {
		t.Errorf("a second read-only view = %v, want it taken", err)
	}
}

// TestBlockDiskKeptTemplate: a template kept after its source went still
// holds the device frozen as its base: a boot that would write it in place
// is refused, naming the template; a read-only view is taken.
func TestBlockDiskKeptTemplate(t *testing.T) {
	dev := loopDevice(t, 1<<20)
	mg, _ := newTestManager(t)
	tp, err := mg.Store.NewTemplate("gone")
	if err != nil {
		t.Fatal(err)
	}
	tp.Name = "golden"
	tp.Disks = []TemplateDisk{{ID: "data", Policy: DiskCow, File: dev, Foreign: true, Size: 1 << 20, Format: "raw"}}
	if err := mg.Store.WriteTemplate(tp); err != nil {
		t.Fatal(err)
	}
	for _, pol := range []DiskPolicy{DiskCow, DiskKeep} {
		err := mg.checkBlockDisksFree(Spec{Disks: []DiskSpec{{ID: "x", File: dev, Fork: pol}}})
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `is the frozen base of template "golden"'s disk "data" (vmfork template rm golden first)`) {
			t.Errorf("%s disk on template golden's frozen device = %v, want it refused", pol, err)
		}
	}
	if err := mg.checkBlockDisksFree(Spec{Disks: []DiskSpec{{ID: "x", File: dev, Fork: DiskShared}}}); err != nil {
		t.Errorf("a read-only view of template golden's device = %v, want it taken", err)
	}
}
