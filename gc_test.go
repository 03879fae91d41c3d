package vmfork

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vmfork/vmfork/overlay"
)

// A template no child maps gives its RAM back at once, even while a later
// template's disk is built on its frozen disk (which then stays).
func TestCollectTemplatesFreesMemoryUnderALaterTemplate(t *testing.T) {
	mg, d := newTestManager(t)
	ctx := t.Context()
	base, err := os.ReadFile(filepath.Join("overlay", "testdata", "base.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	newTpl := func() *Template {
		tpl, err := mg.Store.NewTemplate("src")
		if err != nil {
			t.Fatal(err)
		}
		tpl.HasMemory = true
		for _, f := range []string{tpl.Paths.RAM, tpl.Paths.DevState} {
			if err := os.WriteFile(f, []byte("state"), 0o400); err != nil {
				t.Fatal(err)
			}
		}
		return tpl
	}
	older, newer := newTpl(), newTpl()
	if err := os.WriteFile(older.Paths.Disk, base, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := overlay.Create(ctx, older.Paths.Disk, newer.Paths.Disk); err != nil {
		t.Fatal(err)
	}
	for _, tpl := range []*Template{older, newer} {
		if err := mg.Store.WriteTemplate(tpl); err != nil {
			t.Fatal(err)
		}
	}
	kid := &Machine{Name: "kid", Driver: "fake", State: StateRunning, Paths: mg.Store.MachinePaths("kid"),
		Spec: Spec{Disk: "base"}, Template: newer.ID}
	kid.Paths.RAM, kid.Paths.RAMShared = newer.Paths.RAM, false // as fork.go makes a child
	if err := mg.Store.CreateMachine(kid); err != nil {
		t.Fatal(err)
	}
	if err := overlay.Create(ctx, newer.Paths.Disk, kid.Paths.Disk); err != nil {
		t.Fatal(err)
	}
	d.running["kid"] = true

	mg.collectTemplates(ctx)
	got, err := mg.Store.LoadTemplate(older.ID)
	if err != nil {
		t.Fatalf("older template removed while a chain needs its disk: %v", err)
	}
	if got.HasMemory || exists(older.Paths.RAM) || exists(older.Paths.DevState) {
		t.Errorf("older template kept its memory with no child mapping it")
	}
	if !exists(older.Paths.Disk) {
		t.Errorf("older template's frozen disk removed under a later template")
	}
	if n, err := mg.Store.LoadTemplate(newer.ID); err != nil || !n.HasMemory || !exists(newer.Paths.RAM) {
		t.Errorf("the template the child maps lost its memory: %+v, %v", n, err)
	}
}
