package vmfork

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/overlay"
)

// deadPID is a PID no process has (above the kernel's pid_max).
const deadPID = 1 << 30

// abandon writes a journal entry as a killed vmfork process leaves it.
func abandon(t *testing.T, s *Store, e journalEntry) {
	t.Helper()
	e.PID, e.Started = deadPID, time.Now().UTC().Add(-time.Minute)
	if err := writeJSON(filepath.Join(s.StateDir, dirJournal, string(e.Op)+"-dead.json"), e); err != nil {
		t.Fatal(err)
	}
}

func addMachine(t *testing.T, mg *Manager, name string, st State, tpl string) {
	t.Helper()
	m := &Machine{Name: name, Driver: "fake", State: st, Paths: mg.Store.MachinePaths(name), Parent: "src", Template: tpl,
		Spec: Spec{MemoryMiB: 256, CPUs: 1}, Created: time.Now().UTC().Add(-time.Minute)}
	if err := mg.Store.CreateMachine(m); err != nil {
		t.Fatal(err)
	}
}

func pathExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// A fork killed midway: its unfinished children go, finished ones and
// another fork's stay, and the freeze's temporary RAM file goes.
func TestRecoverKilledFork(t *testing.T) {
	mg, d := newTestManager(t)
	bootFake(t, mg, "src")
	tpl, err := mg.Store.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	tpl.HasMemory = true
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	addMachine(t, mg, "src-1", StateCreating, tpl.ID)  // its identity chain never finished
	addMachine(t, mg, "src-2", StateRunning, tpl.ID)   // ready before the kill
	addMachine(t, mg, "src-3", StateCreating, "src.9") // another fork's, still in progress
	d.running["src-1"], d.running["src-2"] = true, true
	tmp := filepath.Join(mg.Store.MemDir, "."+tpl.ID+".ram.tmp")
	if err := os.WriteFile(tmp, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	abandon(t, mg.Store, journalEntry{Op: "fork", Source: "src", Template: tpl.ID, Machines: []string{"src-1", "src-2", "src-3"}})

	ms, err := mg.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range ms {
		names = append(names, m.Name+"="+string(m.State))
	}
	if got, want := strings.Join(names, ","), "src=running,src-2=running,src-3=creating"; got != want {
		t.Errorf("machines after the repair: got %s, want %s", got, want)
	}
	if d.running["src-1"] {
		t.Error("the half-made child's process was not stopped")
	}
	if pathExists(tmp) {
		t.Errorf("%s left behind", tmp)
	}
	if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirJournal)); n != 0 {
		t.Errorf("%d journal entries left after the repair", n)
	}
}

// A template save killed before its freeze finished leaves no kept name.
func TestRecoverKilledSave(t *testing.T) {
	mg, _ := newTestManager(t)
	bootFake(t, mg, "src")
	tpl, err := mg.Store.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	tpl.Name = "golden"
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	abandon(t, mg.Store, journalEntry{Op: "fork", Source: "src", Template: tpl.ID})
	if err := mg.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Store.FindKept("golden"); !errors.Is(err, ErrNotFound) {
		t.Errorf("FindKept after the repair = %v, want ErrNotFound", err)
	}
}

// An rm killed after its record went to the trash is finished.
func TestRecoverKilledRemove(t *testing.T) {
	mg, _ := newTestManager(t)
	addMachine(t, mg, "web", StateStopped, "")
	p := mg.Store.MachinePaths("web")
	trash := filepath.Join(mg.Store.StateDir, dirMachines, trashPrefix+"web")
	if err := os.Rename(p.Dir, trash); err != nil {
		t.Fatal(err)
	}
	if got := machineNames(t, mg.Store); got != "" {
		t.Errorf("machines with a record in the trash: %q, want none", got)
	}
	abandon(t, mg.Store, journalEntry{Op: "rm", Machines: []string{"web"}})
	if err := mg.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if pathExists(trash) {
		t.Errorf("%s left after the repair", trash)
	}
}

// An interrupted pool fill: the member being started and a member
// directory without a record go; a started member stays.
func TestRecoverKilledPoolFill(t *testing.T) {
	mg, _ := newTestManager(t)
	tpl, err := mg.Store.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	tpl.Name, tpl.HasMemory, tpl.Driver = "golden", true, "fake"
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, st := range []State{StatePooled, StateCreating, ""} {
		m, err := mg.Store.newPoolMember(tpl)
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, m.Paths.Dir)
		if st == "" {
			continue // killed before its record was written
		}
		m.State = st
		if err := mg.Store.savePoolMember(m); err != nil {
			t.Fatal(err)
		}
	}
	abandon(t, mg.Store, journalEntry{Op: "pool", Template: tpl.ID})
	if err := mg.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		if got := pathExists(dirs[i]); got != want {
			t.Errorf("member directory %s exists: %v, want %v", dirs[i], got, want)
		}
	}
}

// A new template id is free of what a command killed during a freeze into
// the same id left.
func TestNewTemplateClearsStaleFiles(t *testing.T) {
	s := newTestStore(t)
	stale := []string{filepath.Join(s.MemDir, ".src.1.ram.tmp"), filepath.Join(s.MemDir, "src.1.ram")}
	for _, f := range stale {
		if err := os.WriteFile(f, []byte("stale"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tpl, err := s.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	if tpl.ID != "src.1" {
		t.Fatalf("NewTemplate id %s, want src.1", tpl.ID)
	}
	for _, f := range stale {
		if pathExists(f) {
			t.Errorf("%s left for the new template", f)
		}
	}
}

// holdImage takes a shared lock on one of QEMU's image lock bytes of path,
// as a running QEMU holds its images, until the test ends.
func holdImage(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	lk := unix.Flock_t{Type: unix.F_RDLCK, Start: 201, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		t.Fatal(err)
	}
}

// TestRepairSourceDisk: after a freeze cut short, the repair records the
// prepared top a QEMU holds as the disk's top, for the boot disk and for
// an extra disk alike (one function, switchedTop, serves both), removes a
// prepared top nobody holds, and leaves images on other bases and disks
// the template did not freeze alone.
func TestRepairSourceDisk(t *testing.T) {
	ctx := t.Context()
	mg, _ := newTestManager(t)
	src := &Machine{Name: "src", Driver: "fake", State: StateRunning, Paths: mg.Store.MachinePaths("src"),
		Spec: Spec{Disk: "/base", Disks: []DiskSpec{{ID: "data", File: "/data"}, {ID: "scratch", File: "/scratch", Fork: DiskFresh}}}}
	if err := mg.Store.CreateMachine(src); err != nil {
		t.Fatal(err)
	}
	tpl, err := mg.Store.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	tpl.Paths.Disk = filepath.Join(tpl.Paths.Dir, "disk.qcow2")
	tpl.Disks = []TemplateDisk{
		{ID: "data", Policy: DiskCow, File: templateDiskFile(tpl.Paths.Dir, "data"), Owned: true},
		{ID: "scratch", Policy: DiskFresh, Size: 1 << 20},
	}
	other := filepath.Join(t.TempDir(), "other.qcow2")
	for _, f := range []string{tpl.Paths.Disk, tpl.Disks[0].File, other} {
		if err := overlay.CreateEmpty(ctx, 1<<20, f); err != nil {
			t.Fatalf("qemu-img (make deps installs qemu-utils): %v", err)
		}
	}
	mk := func(base, top string) string {
		t.Helper()
		p := filepath.Join(src.Paths.Dir, top)
		if err := overlay.Create(ctx, base, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The record's tops (the images the freeze was about to freeze).
	src.Paths.Disk = mk(other, "disk.qcow2")
	src.Paths.Disks = map[string]DiskFile{"data": {File: mk(other, "xdisk-data.qcow2")}, "scratch": {File: mk(other, "xdisk-scratch.qcow2")}}
	// Prepared tops on the template's frozen images: one a QEMU holds
	// (switched to), one nobody holds (never switched to).
	bootHeld, bootIdle := mk(tpl.Paths.Disk, "disk.1.qcow2"), mk(tpl.Paths.Disk, "disk.2.qcow2")
	dataHeld, dataIdle := mk(tpl.Disks[0].File, "xdisk-data.1.qcow2"), mk(tpl.Disks[0].File, "xdisk-data.2.qcow2")
	// Not on the frozen images: none of the repair's business.
	bootOther, scratchOther := mk(other, "disk.3.qcow2"), mk(other, "xdisk-scratch.1.qcow2")
	holdImage(t, bootHeld)
	holdImage(t, dataHeld)
	holdImage(t, scratchOther)

	if err := mg.repairSourceDisk(t.Context(), src, tpl); err != nil {
		t.Fatal(err)
	}
	saved, err := mg.Store.LoadMachine("src")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Machine{src, saved} {
		if m.Paths.Disk != bootHeld {
			t.Errorf("boot disk top = %s, want the held prepared top %s", m.Paths.Disk, bootHeld)
		}
		if got := m.Paths.Disks["data"]; got != (DiskFile{File: dataHeld}) {
			t.Errorf("extra disk data = %+v, want the held prepared top %s", got, dataHeld)
		}
		if got := m.Paths.Disks["scratch"].File; got != filepath.Join(src.Paths.Dir, "xdisk-scratch.qcow2") {
			t.Errorf("fresh disk scratch = %s, want it as it was (the template froze nothing of it)", got)
		}
	}
	for _, f := range []string{bootIdle, dataIdle} {
		if pathExists(f) {
			t.Errorf("prepared top %s that nobody holds is still there", f)
		}
	}
	for _, f := range []string{bootHeld, dataHeld, bootOther, scratchOther, other} {
		if !pathExists(f) {
			t.Errorf("%s was removed, want it left", f)
		}
	}
}

// activeFake is the fake driver with ActiveLayerReporter: layers is what
// its QEMU says each disk writes.
type activeFake struct {
	*fakeDriver
	layers ActiveLayers
}

func (d activeFake) ActiveLayers(context.Context, *Machine) (ActiveLayers, error) {
	return d.layers, nil
}

// TestRepairSourceDiskActiveLayer: where the driver can ask the running
// QEMU which image each disk writes, the repair records that one and not
// the image QEMU merely holds. qemudrv opens every disk's next top before
// the pause, so a vmfork killed between the freeze's hard link and its
// switch leaves a held prepared top that the guest does not write: the
// boot disk here (active: the record's top), which the lock check alone
// recorded. The extra disk was switched (active: its prepared top).
func TestRepairSourceDiskActiveLayer(t *testing.T) {
	ctx := t.Context()
	mg, fd := newTestManager(t)
	src := &Machine{Name: "src", Driver: "fake", State: StateRunning, Paths: mg.Store.MachinePaths("src"),
		Spec: Spec{Disk: "/base", Disks: []DiskSpec{{ID: "data", File: "/data"}}}}
	if err := mg.Store.CreateMachine(src); err != nil {
		t.Fatal(err)
	}
	tpl, err := mg.Store.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	tpl.Paths.Disk = filepath.Join(tpl.Paths.Dir, "disk.qcow2")
	tpl.Disks = []TemplateDisk{{ID: "data", Policy: DiskCow, File: templateDiskFile(tpl.Paths.Dir, "data"), Owned: true}}
	other := filepath.Join(t.TempDir(), "other.qcow2")
	for _, f := range []string{tpl.Paths.Disk, tpl.Disks[0].File, other} {
		if err := overlay.CreateEmpty(ctx, 1<<20, f); err != nil {
			t.Fatalf("qemu-img (make deps installs qemu-utils): %v", err)
		}
	}
	mk := func(base, top string) string {
		t.Helper()
		p := filepath.Join(src.Paths.Dir, top)
		if err := overlay.Create(ctx, base, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bootCur := mk(other, "disk.qcow2")
	src.Paths.Disk = bootCur
	src.Paths.Disks = map[string]DiskFile{"data": {File: mk(other, "xdisk-data.qcow2")}}
	bootPrepared := mk(tpl.Paths.Disk, "disk.1.qcow2")
	dataPrepared := mk(tpl.Disks[0].File, "xdisk-data.1.qcow2")
	holdImage(t, bootPrepared) // opened ahead of the switch, never switched to
	holdImage(t, dataPrepared)
	fd.running["src"] = true
	// QEMU names the switched top by a json: filename (imageFile), here
	// by its path: either way a name for the same file.
	mg.Driver = activeFake{fd, ActiveLayers{Disk: bootCur, Disks: map[string]string{"data": dataPrepared}}}

	if err := mg.repairSourceDisk(ctx, src, tpl); err != nil {
		t.Fatal(err)
	}
	saved, err := mg.Store.LoadMachine("src")
	if err != nil {
		t.Fatal(err)
	}
	if saved.Paths.Disk != bootCur || src.Paths.Disk != bootCur {
		t.Errorf("boot disk top = %s (saved %s), want %s, the top QEMU writes, not the held prepared top", src.Paths.Disk, saved.Paths.Disk, bootCur)
	}
	if got := saved.Paths.Disks["data"]; got != (DiskFile{File: dataPrepared}) {
		t.Errorf("extra disk data = %+v, want the active prepared top %s", got, dataPrepared)
	}
	if pathExists(bootPrepared) {
		t.Errorf("prepared top %s that QEMU holds but does not write is still there", bootPrepared)
	}
	for _, f := range []string{bootCur, dataPrepared} {
		if !pathExists(f) {
			t.Errorf("%s was removed, want it left", f)
		}
	}
}
