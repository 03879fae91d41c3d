package vmfork

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmfork/vmfork/overlay"
)

// poolDisks is the pool driver with extra disks. Its freeze leaves the
// files as QEMU's does: each top the template freezes gets the template's
// name too (the source's later writes are no concern here). Its prestart
// checks that the member's QEMU would find every extra disk.
type poolDisks struct{ *poolDriver }

func (poolDisks) DiskPolicies() []DiskPolicy {
	return []DiskPolicy{DiskCow, DiskShared, DiskFresh, DiskKeep}
}
func (poolDisks) BootsDisks() bool { return true }

func (d poolDisks) Freeze(ctx context.Context, src *Machine, t *Template, opts FreezeOptions) (FreezeResult, error) {
	if err := os.Link(src.Paths.Disk, t.Paths.Disk); err != nil {
		return FreezeResult{}, err
	}
	for _, td := range t.Disks {
		if td.Owned {
			if err := os.Link(src.Paths.Disks[td.ID].File, td.File); err != nil {
				return FreezeResult{}, err
			}
		}
	}
	return d.poolDriver.Freeze(ctx, src, t, opts)
}

func (d poolDisks) Prestart(ctx context.Context, m *Machine, t *Template) error {
	for _, td := range t.Disks {
		f, ok := m.Paths.Disks[td.ID]
		if !ok {
			return fmt.Errorf("member %s starts without its disk %q", m.Name, td.ID)
		}
		if _, err := os.Stat(f.File); err != nil {
			return fmt.Errorf("member %s: disk %q: %w", m.Name, td.ID, err)
		}
	}
	return d.poolDriver.Prestart(ctx, m, t)
}

// TestPoolWithExtraDisks: a kept template of a machine with extra disks
// keeps a warm pool whose members start with every disk by its policy (an
// overlay on the frozen image, the shared image read-only, an empty disk),
// and the children that take members get those disks, as cold children
// get theirs; removing the children leaves the template's images whole.
func TestPoolWithExtraDisks(t *testing.T) {
	ctx := t.Context()
	mg, pd := newPoolManager(t)
	d := poolDisks{pd}
	mg.Driver = d
	dir := t.TempDir()
	img := func(name string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := overlay.CreateEmpty(ctx, 1<<20, p); err != nil {
			t.Fatalf("qemu-img (make deps installs qemu-utils): %v", err)
		}
		return p
	}
	ro := img("ro.qcow2")
	src := &Machine{Name: "src", Driver: "fake", State: StateRunning, Paths: mg.Store.MachinePaths("src"),
		Spec: Spec{Disk: img("os.qcow2"), MemoryMiB: 256, CPUs: 1, Disks: []DiskSpec{
			{ID: "data", File: img("data.qcow2")}, {ID: "ro", File: ro, Fork: DiskShared}, {ID: "scratch", File: img("scratch.qcow2"), Fork: DiskFresh},
		}}, Created: time.Now().UTC()}
	if err := mg.Store.CreateMachine(src); err != nil {
		t.Fatal(err)
	}
	if err := overlay.Create(ctx, src.Spec.Disk, src.Paths.Disk); err != nil {
		t.Fatal(err)
	}
	if err := PrepareDisks(ctx, src); err != nil {
		t.Fatal(err)
	}
	if err := mg.Store.SaveMachine(src); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	d.running["src"] = true
	d.mu.Unlock()

	tpl, err := mg.Keep(ctx, KeepRequest{Source: "src", Name: "golden", Pool: 2})
	if err != nil {
		t.Fatalf("template save --pool 2 of a machine with extra disks: %v", err)
	}
	if pooled(t, mg, tpl.ID) != 2 || len(tpl.Disks) != 3 {
		t.Fatalf("kept with %d pooled and disks %+v, want 2 pooled and 3 extra disks", pooled(t, mg, tpl.ID), tpl.Disks)
	}
	frozen := tpl.Disks[0].File
	frozenSum := fileSum(t, frozen)
	res, err := mg.Fork(ctx, ForkRequest{Source: "golden", Count: 3, Parallel: 1, Identity: quietChain})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.completed) != 2 || len(d.started) != 1 {
		t.Fatalf("from the pool %v, cold %v; want 2 and 1", d.completed, d.started)
	}
	for _, cr := range res.Children {
		c, err := mg.Store.LoadMachine(cr.Name)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Clean(c.Paths.Dir)
		data := c.Paths.Disks["data"]
		if chain, err := overlay.Chain(data.File); err != nil || filepath.Dir(data.File) != dir || len(chain) < 2 || chain[1].Path != frozen {
			t.Errorf("child %s's data disk %+v: chain %+v, %v; want its own overlay in %s on the frozen %s", c.Name, data, chain, err, dir, frozen)
		}
		if f := c.Paths.Disks["ro"]; f.File != ro || !f.ReadOnly {
			t.Errorf("child %s's shared disk = %+v, want %s read-only", c.Name, f, ro)
		}
		scratch := c.Paths.Disks["scratch"]
		if chain, err := overlay.Chain(scratch.File); err != nil || filepath.Dir(scratch.File) != dir || len(chain) != 1 || chain[0].VirtualSize != 1<<20 {
			t.Errorf("child %s's fresh disk %+v: chain %+v, %v; want an empty 1 MiB image of its own in %s", c.Name, scratch, chain, err, dir)
		}
		if len(c.Spec.Disks) != 3 || c.Spec.Disks[1].Policy() != DiskShared {
			t.Errorf("child %s's disks %+v, want the three with ro shared", c.Name, c.Spec.Disks)
		}
		if err := mg.Remove(ctx, c.Name, true); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(data.File); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("removed child %s's data overlay %s is left: %v", c.Name, data.File, err)
		}
	}
	if got := fileSum(t, frozen); got != frozenSum {
		t.Errorf("the template's frozen data disk changed")
	}
	if _, err := os.Stat(ro); err != nil {
		t.Errorf("the shared image went with a child: %v", err)
	}
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}
