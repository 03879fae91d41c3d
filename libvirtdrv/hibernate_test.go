package libvirtdrv

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
)

// Hibernate, resume and rewind start a machine's new process in place
// (StartInPlace: its transient domain is gone with its QEMU, and so is the
// name's claim): the Manager takes them on this driver as on the embedded
// one. A machine or checkpoint that does not exist is named as missing,
// not the verb as unsupported, before any libvirt call (the driver has no
// connection here), and nothing is journaled.
func TestInPlaceVerbs(t *testing.T) {
	store, err := vmfork.OpenStore(t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mg := vmfork.NewManager(store, &Driver{}, nil) // no connection: a libvirt call would fail
	_, herr := mg.Hibernate(t.Context(), "web")
	_, rerr := mg.Resume(t.Context(), vmfork.ResumeRequest{Machine: "web"})
	_, werr := mg.Rewind(t.Context(), vmfork.RewindRequest{Machine: "web", To: "web-cp1"})
	_, perr := mg.PlanHibernate(t.Context(), "web")
	for verb, err := range map[string]error{"hibernate": herr, "resume": rerr, "rewind": werr, "hibernate --dry-run": perr} {
		if errors.Is(err, vmfork.ErrUnsupported) || !errors.Is(err, vmfork.ErrNotFound) {
			t.Errorf("%s of a machine that does not exist: %v, want not found", verb, err)
		}
	}
	// The embedded driver's hibernated machine comes back on its own
	// driver: one line saying so, before anything is read back.
	if err := os.MkdirAll(store.MachinePaths("emb").Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := store.SaveMachine(&vmfork.Machine{Name: "emb", Driver: "qemu", State: vmfork.StateHibernated, Hibernated: "emb.1", Paths: store.MachinePaths("emb")}); err != nil {
		t.Fatal(err)
	}
	_, err = mg.Resume(t.Context(), vmfork.ResumeRequest{Machine: "emb"})
	if want := `resume "emb": machine belongs to driver "qemu"`; err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Errorf("resume of the embedded driver's machine: %v, want one line saying %q", err, want)
	}
	if es, _ := os.ReadDir(store.StateDir + "/journal"); len(es) != 0 {
		t.Errorf("a hibernate, resume or rewind of nothing journaled %d entries", len(es))
	}
}
