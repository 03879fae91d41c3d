package vmfork

import (
	"bytes"
	"context"
	"errors"
	"github.com/vmfork/vmfork/contract"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmfork/vmfork/overlay"
)

// hibDriver is the pool driver whose freeze writes the template's RAM file
// the way the embedded driver's does: sparse, a few pages of data, one of
// them all zeros.
type hibDriver struct {
	*poolDriver
	applied map[string]*contract.Contract // ApplyContract's, by machine (contracts_test.go)
}

func (d *hibDriver) Freeze(ctx context.Context, src *Machine, t *Template, opts FreezeOptions) (FreezeResult, error) {
	fr, err := d.poolDriver.Freeze(ctx, src, t, opts)
	if err != nil {
		return fr, err
	}
	os.Remove(t.Paths.RAM) // the fake freeze's empty one
	f, err := os.OpenFile(t.Paths.RAM, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o400)
	if err != nil {
		return fr, err
	}
	defer f.Close()
	f.Truncate(int64(src.Spec.MemoryMiB) << 20)
	f.WriteAt(bytes.Repeat([]byte{9}, 2*4096), 1<<20)
	f.WriteAt(make([]byte, 4096), 2<<20) // touched, freed: zeros
	return fr, nil
}

func newHibManager(t *testing.T) (*Manager, *hibDriver) {
	mg, pd := newPoolManager(t)
	d := &hibDriver{poolDriver: pd}
	mg.Driver = d
	return mg, d
}

func TestHibernateForkResumeRm(t *testing.T) {
	mg, d := newHibManager(t)
	bootFake(t, mg, "web")
	before, _ := mg.Store.LoadMachine("web")
	res, err := mg.Hibernate(t.Context(), "web")
	if err != nil {
		t.Fatal(err)
	}
	m, err := mg.Get(t.Context(), "web")
	if err != nil || m.State != StateHibernated || m.PID != 0 || d.running["web"] {
		t.Fatalf("after hibernate: %+v (%v), running %v; want hibernated, no process", m, err, d.running["web"])
	}
	// Frozen and ended without running on in between.
	if !slices.Contains(d.stoppedPaused, "web") || slices.Contains(d.resumed, "web") {
		t.Errorf("hibernate resumed web after the freeze (stopped while paused: %v, resumed %v); want it ended paused", d.stoppedPaused, d.resumed)
	}
	tpl, err := mg.Store.LoadTemplate(res.Template)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tpl.Paths.RAM); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("template RAM in the mem dir: %v, want it gone", err)
	}
	if !strings.HasPrefix(res.RAMFile, mg.Store.StateDir) || res.RAMBytes != 2*4096 || res.RAMSizeBytes != 256<<20 {
		t.Errorf("hibernate = %+v, want the RAM under the state dir, 8 KiB stored of 256 MiB", res)
	}
	if alloc, _ := overlay.AllocatedBytes(res.RAMFile); alloc > 1<<20 {
		t.Errorf("RAM file on disk holds %d bytes, want it sparse", alloc)
	}
	if _, err := mg.Hibernate(t.Context(), "web"); !errors.Is(err, ErrInvalid) {
		t.Errorf("second hibernate: %v, want ErrInvalid", err)
	}
	if _, err := mg.Stop(t.Context(), "web", false); !errors.Is(err, ErrInvalid) {
		t.Errorf("stop of a hibernated machine: %v, want ErrInvalid", err)
	}

	// A fork leaves it hibernated; its children map the RAM brought back.
	fr, err := mg.Fork(t.Context(), ForkRequest{Source: "web", Count: 2, Identity: quietChain})
	if err != nil || len(fr.Children) != 2 || fr.Template != tpl.ID {
		t.Fatalf("fork of hibernated web: %+v, %v", fr, err)
	}
	if m, _ := mg.Get(t.Context(), "web"); m.State != StateHibernated || d.running["web"] {
		t.Errorf("the fork changed web: %+v", m)
	}
	if _, err := os.Stat(tpl.Paths.RAM); err != nil {
		t.Errorf("children's RAM file: %v", err)
	}
	for _, c := range fr.Children {
		if err := mg.Remove(t.Context(), c.Name, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(tpl.Paths.RAM); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mem-dir RAM with no child left: %v, want it freed", err)
	}
	if _, err := os.Stat(res.RAMFile); err != nil {
		t.Errorf("RAM on disk after the children went: %v", err)
	}

	rr, err := mg.Resume(t.Context(), ResumeRequest{Machine: "web", Identity: quietChain})
	if err != nil {
		t.Fatal(err)
	}
	m, _ = mg.Get(t.Context(), "web")
	if rr.Name != "web" || m.State != StateRunning || !d.running["web"] || m.Hibernated != "" || m.Template != tpl.ID {
		t.Fatalf("after resume: %+v", m)
	}
	if m.GuestMAC != before.Spec.MAC || m.Created != before.Created || m.Paths.Dir != before.Paths.Dir || m.VMGenID != tpl.VMGenID {
		t.Errorf("resume changed web's MAC, creation, directory or vmgenid: %+v, was %+v", m, before)
	}
	if _, err := os.Stat(res.RAMFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("RAM on disk after resume: %v, want it removed", err)
	}
	if _, err := mg.Resume(t.Context(), ResumeRequest{Machine: "web"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("resume of a running machine: %v, want ErrInvalid", err)
	}
	// Hibernated again, then removed: nothing is left.
	if _, err := mg.Hibernate(t.Context(), "web"); err != nil {
		t.Fatal(err)
	}
	if err := mg.Remove(t.Context(), "web", false); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, mg.Store); len(l) != 0 {
		t.Errorf("rm of a hibernated machine left %v", l)
	}
}

func TestHibernateUnsupportedChangesNothing(t *testing.T) {
	mg, d := newTestManager(t) // no in-place starts: like the libvirt driver
	bootFake(t, mg, "web")
	for verb, err := range map[string]error{
		"hibernate": func() error { _, err := mg.Hibernate(t.Context(), "web"); return err }(),
		"resume":    func() error { _, err := mg.Resume(t.Context(), ResumeRequest{Machine: "web"}); return err }(),
	} {
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), verb+" is not supported by the fake driver") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line saying it is not supported by the driver", verb, err)
		}
	}
	if d.freezeSeen != 0 || !d.running["web"] {
		t.Errorf("refused hibernate froze %d times; web running %v", d.freezeSeen, d.running["web"])
	}
	if _, err := mg.PlanHibernate(t.Context(), "web"); !errors.Is(err, ErrUnsupported) {
		t.Errorf("dry run: %v, want ErrUnsupported", err)
	}
}

// orphanJournal makes every journal entry look like one of a dead vmfork.
func orphanJournal(t *testing.T, s *Store) {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(s.StateDir, dirJournal, "*.json"))
	if len(paths) == 0 {
		t.Fatal("no journal entry")
	}
	for _, p := range paths {
		var e journalEntry
		if err := readJSON(p, &e); err != nil {
			t.Fatal(err)
		}
		e.PID = 1 << 30 // no such process
		if err := writeJSON(p, e); err != nil {
			t.Fatal(err)
		}
	}
}

// A hibernate killed before its commit leaves the machine running; one
// killed after it, a complete hibernated machine; a resume killed midway,
// the machine hibernated.
func TestHibernateCrashRepair(t *testing.T) {
	t.Run("before the commit", func(t *testing.T) {
		mg, d := newHibManager(t)
		bootFake(t, mg, "web")
		m, _ := mg.Store.LoadMachine("web")
		tpl, _, err := mg.prepareHibernation(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := mg.freezeRunning(t.Context(), d, m, tpl, FreezeOptions{LeavePaused: true}); err != nil {
			t.Fatal(err)
		}
		orphanJournal(t, mg.Store)
		if err := mg.Recover(t.Context()); err != nil {
			t.Fatal(err)
		}
		m, _ = mg.Get(t.Context(), "web")
		if m.State != StateRunning || m.Hibernated != "" || !d.running["web"] {
			t.Errorf("after repair: %+v, want web running", m)
		}
		if _, err := mg.Store.LoadTemplate(tpl.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("the half-made template: %v, want it collected", err)
		}
	})
	t.Run("after the commit", func(t *testing.T) {
		mg, d := newHibManager(t)
		bootFake(t, mg, "web")
		m, _ := mg.Store.LoadMachine("web")
		tpl, _, err := mg.prepareHibernation(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := mg.freezeRunning(t.Context(), d, m, tpl, FreezeOptions{LeavePaused: true}); err != nil {
			t.Fatal(err)
		}
		m.State = StateHibernated // the commit; the RAM is in the mem dir only
		mg.Store.SaveMachine(m)
		orphanJournal(t, mg.Store)
		if err := mg.Recover(t.Context()); err != nil {
			t.Fatal(err)
		}
		m, _ = mg.Get(t.Context(), "web")
		if m.State != StateHibernated || m.PID != 0 || d.running["web"] {
			t.Errorf("after repair: %+v (running %v), want web hibernated with no process", m, d.running["web"])
		}
		if _, err := os.Stat(tpl.Paths.RAM); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("mem-dir RAM: %v, want it freed", err)
		}
		tpl, _ = mg.Store.LoadTemplate(tpl.ID)
		if alloc, err := overlay.AllocatedBytes(tpl.Hibernation); err != nil || alloc != 2*4096 {
			t.Errorf("RAM on disk after the repair: %d bytes (%v), want the 2 pages of data", alloc, err)
		}
		// The resume, killed once its process ran, is put back.
		tpl, _ = mg.Store.LoadTemplate(tpl.ID)
		if err := mg.Store.thaw(t.Context(), tpl); err != nil {
			t.Fatal(err)
		}
		done, _ := mg.Store.journal(journalEntry{Op: "resume", Source: "web", Template: tpl.ID})
		_ = done
		c, err := mg.resumedMachine(t.Context(), m, tpl)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.StartChild(t.Context(), c, tpl); err != nil {
			t.Fatal(err)
		}
		orphanJournal(t, mg.Store)
		if err := mg.Recover(t.Context()); err != nil {
			t.Fatal(err)
		}
		m, _ = mg.Get(t.Context(), "web")
		if m.State != StateHibernated || d.running["web"] {
			t.Errorf("after a repaired resume: %+v (running %v), want hibernated", m, d.running["web"])
		}
		if _, err := mg.Resume(t.Context(), ResumeRequest{Machine: "web", Identity: quietChain}); err != nil {
			t.Errorf("resume after the repair: %v", err)
		}
	})
}

func TestCopySparseSkipsZeroPages(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, _ := os.Create(src)
	f.Truncate(4 << 20)
	f.WriteAt(make([]byte, 64<<10), 0) // allocated zeros
	f.WriteAt([]byte("x"), 3<<20+5)
	f.Close()
	dst := filepath.Join(dir, "dst")
	n, err := copySparse(t.Context(), src, dst, false)
	if err != nil || n != 4096 {
		t.Fatalf("copySparse = %d, %v; want one page", n, err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Error("copy differs")
	}
	if _, err := copySparse(t.Context(), src, dst, false); !errors.Is(err, os.ErrExist) {
		t.Errorf("copy over an existing file: %v, want ErrExist", err)
	}
}

// Dry runs check as the real runs do and change nothing.
func TestHibernateDryRuns(t *testing.T) {
	mg, d := newHibManager(t)
	bootFake(t, mg, "web")
	p, err := mg.PlanHibernate(t.Context(), "web")
	if err != nil || !p.DryRun || !p.SourcePauses || len(p.Actions) != 2 {
		t.Fatalf("plan hibernate = %+v, %v", p, err)
	}
	if _, err := mg.PlanResume(t.Context(), ResumeRequest{Machine: "web"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("plan resume of a running machine: %v, want ErrInvalid", err)
	}
	if m, _ := mg.Get(t.Context(), "web"); m.State != StateRunning || d.freezeSeen != 0 {
		t.Fatalf("a dry run changed web: %+v, %d freezes", m, d.freezeSeen)
	}
	if _, err := mg.Hibernate(t.Context(), "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.PlanHibernate(t.Context(), "web"); !errors.Is(err, ErrInvalid) {
		t.Errorf("plan hibernate of a hibernated machine: %v, want ErrInvalid", err)
	}
	if p, err := mg.PlanResume(t.Context(), ResumeRequest{Machine: "web"}); err != nil || p.Command != "resume" {
		t.Errorf("plan resume = %+v, %v", p, err)
	}
	p, err = mg.PlanFork(t.Context(), ForkRequest{Source: "web", Count: 2})
	if err != nil || len(p.Children) != 2 || !strings.Contains(p.Actions[0], "stays hibernated") {
		t.Errorf("plan fork of a hibernated machine = %+v, %v", p, err)
	}
	p, errs := mg.PlanRemove(t.Context(), []string{"web"}, false)
	if errs[0] != nil || !strings.Contains(p.Actions[0], "hibernated machine") {
		t.Errorf("plan rm = %+v, %v", p, errs)
	}
	if m, _ := mg.Get(t.Context(), "web"); m.State != StateHibernated {
		t.Errorf("dry runs changed the hibernated machine: %+v", m)
	}
}
