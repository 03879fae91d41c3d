package vmfork

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmfork/vmfork/overlay"
)

func (d *agentDriver) SwitchDisks(ctx context.Context, src *Machine, t *Template) error {
	g := d.guest(src.Name)
	g.mu.Lock()
	frozen := g.frozen
	g.mu.Unlock()
	d.mu.Lock()
	d.frozenAtSwitch = append(d.frozenAtSwitch, frozen)
	d.mu.Unlock()
	return d.fakeDriver.SwitchDisks(ctx, src, t)
}

// newDiskOnlyManager boots running machine "web" with a qcow2 disk on the
// fake driver with a fake guest agent.
func newDiskOnlyManager(t *testing.T) (*Manager, *agentDriver) {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	if err := overlay.CreateEmpty(ctx, 2<<20, base); err != nil {
		t.Fatalf("qemu-img (make deps installs qemu-utils): %v", err)
	}
	kernel := filepath.Join(dir, "vmlinuz")
	if err := os.WriteFile(kernel, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := newAgentDriver()
	mg := NewManager(newTestStore(t), d, nil)
	if _, err := mg.Boot(ctx, BootRequest{Name: "web", Spec: Spec{Kernel: kernel, Disk: base, MemoryMiB: 256, CPUs: 1}}); err != nil {
		t.Fatal(err)
	}
	// The fake driver makes no disk: the real one's first overlay.
	if m, err := mg.Store.LoadMachine("web"); err != nil {
		t.Fatal(err)
	} else if _, err := os.Stat(m.Paths.Disk); err != nil {
		if err := overlay.Create(ctx, base, m.Paths.Disk); err != nil {
			t.Fatal(err)
		}
	}
	return mg, d
}

func TestForkDiskOnly(t *testing.T) {
	mg, d := newDiskOnlyManager(t)
	ctx := t.Context()
	req := ForkRequest{Source: "web", Count: 2, DiskOnly: true, Identity: fakeGuestIdentity}
	before := stateTree(t, mg.Store)
	p, err := mg.PlanFork(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := stateTree(t, mg.Store); got != before {
		t.Fatalf("the dry run changed the state dir:\n%s", got)
	}
	if p.SourcePauses || !strings.Contains(strings.Join(p.Actions, "\n"), "disk-only: no pause, filesystems frozen for the switch, children boot") {
		t.Errorf("plan: pauses %v, actions %q; want no pause and the disk-only line", p.SourcePauses, p.Actions)
	}
	srcBefore, _ := mg.Store.LoadMachine("web")
	res, err := mg.Fork(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !res.DiskOnly || res.PauseMS != 0 || len(res.Children) != 2 {
		t.Errorf("result %+v: want disk-only, no pause, 2 children", res)
	}
	if g := d.guest("web"); !slices.Equal(g.fsLog, []string{"freeze", "thaw"}) || g.frozen {
		t.Errorf("guest fs log %v (frozen now %v), want freeze then thaw", g.fsLog, g.frozen)
	}
	if !slices.Equal(d.frozenAtSwitch, []bool{true}) {
		t.Errorf("frozen at the switch: %v, want [true]", d.frozenAtSwitch)
	}
	if d.freezeSeen != 0 || len(d.resumed) != 0 {
		t.Errorf("Freeze called %d times, resumed %v: the vCPUs must never stop", d.freezeSeen, d.resumed)
	}
	src, _ := mg.Store.LoadMachine("web")
	tpl, err := mg.Store.LoadTemplate(res.Template)
	if err != nil {
		t.Fatal(err)
	}
	if src.Paths.Disk == srcBefore.Paths.Disk || tpl.HasMemory || tpl.Paths.RAM != "" {
		t.Errorf("source disk %s (was %s), template memory %v %q: want a new top and a disk-only template", src.Paths.Disk, srcBefore.Paths.Disk, tpl.HasMemory, tpl.Paths.RAM)
	}
	for _, c := range res.Children {
		chain, err := overlay.Chain(mg.Store.MachinePaths(c.Name).Disk)
		if err != nil || len(chain) < 2 || chain[1].Path != tpl.Paths.Disk {
			t.Errorf("child %s's disk chain %+v (%v), want it on the template's %s", c.Name, chain, err, tpl.Paths.Disk)
		}
	}
	if left := dirEntries(t, filepath.Join(mg.Store.StateDir, dirJournal)); left != 0 {
		t.Errorf("%d journal entries left", left)
	}
}

func TestForkDiskOnlyRefusals(t *testing.T) {
	mg, d := newDiskOnlyManager(t)
	ctx := t.Context()
	d.guest("web").noFreeze = true
	before := withoutLocks(stateTree(t, mg.Store))
	_, err := mg.Fork(ctx, ForkRequest{Source: "web", Count: 1, DiskOnly: true, Identity: fakeGuestIdentity})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "guest-fsfreeze-freeze") || !strings.Contains(err.Error(), "--crash-consistent") {
		t.Errorf("fork of a guest that cannot freeze: %v; want ErrInvalid naming fsfreeze and --crash-consistent", err)
	}
	if got := withoutLocks(stateTree(t, mg.Store)); got != before || len(d.switched) != 0 {
		t.Errorf("a refused disk-only fork changed things (switched %v):\n%s", d.switched, got)
	}
	// Accepted crash-consistent: no freeze at all.
	res, err := mg.Fork(ctx, ForkRequest{Source: "web", Count: 1, DiskOnly: true, CrashConsistent: true, Identity: fakeGuestIdentity})
	if err != nil || len(res.Children) != 1 || res.FSFrozenMS != 0 {
		t.Fatalf("crash-consistent fork: %+v, %v", res, err)
	}
	if !slices.Equal(d.frozenAtSwitch, []bool{false}) || len(d.guest("web").fsLog) != 0 {
		t.Errorf("frozen at the switch %v, fs log %v: want no freeze", d.frozenAtSwitch, d.guest("web").fsLog)
	}
	// A stopped source.
	if _, err := mg.Stop(ctx, "web", true); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Fork(ctx, ForkRequest{Source: "web", Count: 1, DiskOnly: true}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "it is stopped") {
		t.Errorf("disk-only fork of a stopped machine: %v, want ErrInvalid", err)
	}
}

// A switch that fails thaws the guest and leaves the source on its disk.
func TestForkDiskOnlySwitchFailureThaws(t *testing.T) {
	mg, d := newDiskOnlyManager(t)
	d.switchErr = errors.New("injected switch failure")
	srcBefore, _ := mg.Store.LoadMachine("web")
	_, err := mg.Fork(t.Context(), ForkRequest{Source: "web", Count: 2, DiskOnly: true, Identity: fakeGuestIdentity})
	if err == nil || !strings.Contains(err.Error(), "injected switch failure") {
		t.Fatalf("fork: %v, want the switch's error", err)
	}
	if g := d.guest("web"); g.frozen || !slices.Equal(g.fsLog, []string{"freeze", "thaw"}) {
		t.Errorf("after a failed switch: frozen %v, log %v; want thawed", g.frozen, g.fsLog)
	}
	src, _ := mg.Store.LoadMachine("web")
	if src.Paths.Disk != srcBefore.Paths.Disk || machineNames(t, mg.Store) != "web" {
		t.Errorf("after a failed switch: disk %s, machines %s; want the source alone on its disk", src.Paths.Disk, machineNames(t, mg.Store))
	}
}

// A vmfork killed with the guest frozen leaves a journal entry saying
// Thaw; the next command's repair thaws the guest.
func TestRepairThawsDiskOnlyFork(t *testing.T) {
	mg, d := newDiskOnlyManager(t)
	ctx := t.Context()
	g := d.guest("web")
	g.frozen = true
	abandon(t, mg.Store, journalEntry{Op: opFork, Source: "web", Template: "t-gone", Thaw: true})
	if err := mg.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if g.frozen || !slices.Equal(g.fsLog, []string{"thaw"}) {
		t.Errorf("after the repair: frozen %v, log %v; want thawed", g.frozen, g.fsLog)
	}
}

// forkOnlyDisks is a driver that forks running machines with extra disks
// but cannot boot one from its record.
type forkOnlyDisks struct{ *agentDriver }

func (forkOnlyDisks) DiskPolicies() []DiskPolicy {
	return []DiskPolicy{DiskCow, DiskShared, DiskFresh, DiskKeep}
}
func (forkOnlyDisks) BootsDisks() bool { return false }

// A disk-only fork's children boot from the record: a driver that cannot
// boot a machine's extra disks, and an adopted machine (whose record does
// not hold its domain), are refused before anything changes.
func TestForkDiskOnlyBootsFromRecord(t *testing.T) {
	mg, d := newDiskOnlyManager(t)
	ctx := t.Context()
	m, err := mg.Store.LoadMachine("web")
	if err != nil {
		t.Fatal(err)
	}
	m.Spec.Disks = []DiskSpec{{ID: "data", File: m.Spec.Disk}}
	m.Paths.Disks = map[string]DiskFile{"data": {File: m.Paths.Disk}}
	if err := mg.Store.SaveMachine(m); err != nil {
		t.Fatal(err)
	}
	mg.Driver = forkOnlyDisks{d}
	before := withoutLocks(stateTree(t, mg.Store))
	req := ForkRequest{Source: "web", Count: 1, DiskOnly: true, Identity: fakeGuestIdentity}
	if _, err := mg.Fork(ctx, req); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `--disk-only: driver "fake" cannot boot a machine with more than one disk (disk "data")`) {
		t.Errorf("disk-only fork with a driver that boots one disk: %v, want ErrInvalid naming the driver and disk", err)
	}
	if got := withoutLocks(stateTree(t, mg.Store)); got != before {
		t.Errorf("a refused disk-only fork changed things:\n%s", got)
	}
	// A live fork of the same machine is the driver's to do.
	if _, err := mg.PlanFork(ctx, ForkRequest{Source: "web", Count: 1, Identity: fakeGuestIdentity}); err != nil {
		t.Errorf("plan of a live fork: %v", err)
	}
	mg.Driver = d
	m.Spec.Disks, m.Paths.Disks = nil, nil
	m.Adopted = &Adoption{ID: "0b5e7f4c-0000-4000-8000-000000000001"}
	if err := mg.Store.SaveMachine(m); err != nil {
		t.Fatal(err)
	}
	before = withoutLocks(stateTree(t, mg.Store))
	if _, err := mg.Fork(ctx, req); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "cannot hold all of an adopted fake domain's definition") {
		t.Errorf("disk-only fork of an adopted machine: %v, want ErrInvalid", err)
	}
	if got := withoutLocks(stateTree(t, mg.Store)); got != before || len(d.switched) != 0 || len(d.guest("web").fsLog) != 0 {
		t.Errorf("a refused disk-only fork changed things (switched %v, fs %v):\n%s", d.switched, d.guest("web").fsLog, got)
	}
}
