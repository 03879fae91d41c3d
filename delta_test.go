package vmfork

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmfork/vmfork/overlay"
)

const testPage = 4096

// deltaTemplate makes template tpl a delta on file base: its base name is a
// hard link to base, its delta one page of 'd' at page 1.
func deltaTemplate(t *testing.T, s *Store, base string) *Template {
	t.Helper()
	tpl, err := s.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	b, pages := DeltaPaths(tpl.Paths.RAM)
	if err := os.Link(base, b); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(pages, os.O_CREATE|os.O_WRONLY, 0o400)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(4 * testPage)
	f.WriteAt(bytes.Repeat([]byte{'d'}, testPage), testPage)
	f.Close()
	tpl.HasMemory = true
	tpl.RAMDelta = &RAMDelta{Base: b, Pages: pages, Bytes: testPage}
	if err := s.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	return tpl
}

// A delta template's base outlives the template it came from; the record
// and its children find the base; compaction makes one full file of base
// and delta and drops the delta; removal takes the delta's files.
func TestDeltaTemplateFiles(t *testing.T) {
	s := newTestStore(t)
	first, err := s.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(first.Paths.RAM, bytes.Repeat([]byte{'a'}, 4*testPage), 0o400); err != nil {
		t.Fatal(err)
	}
	tpl := deltaTemplate(t, s, first.Paths.RAM)
	if tpl.MappedRAM() != tpl.RAMDelta.Base {
		t.Errorf("a delta template's children map %s, want its base", tpl.MappedRAM())
	}
	if err := s.RemoveTemplate(first.ID); err != nil {
		t.Fatal(err)
	}
	if TemplateRAMLost(tpl) {
		t.Error("the delta template lost its RAM when its base's own template went")
	}
	if _, err := os.Stat(tpl.Paths.RAM); !os.IsNotExist(err) {
		t.Fatalf("a delta template has a full RAM file before compaction (%v)", err)
	}
	if err := s.CompactRAM(t.Context(), tpl); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{'a'}, 4*testPage)
	copy(want[testPage:], bytes.Repeat([]byte{'d'}, testPage))
	if got, err := os.ReadFile(tpl.Paths.RAM); err != nil || !bytes.Equal(got, want) {
		t.Errorf("compacted RAM is not base + delta (%v)", err)
	}
	rec, err := s.LoadTemplate(tpl.ID)
	if err != nil || rec.RAMDelta != nil || rec.MappedRAM() != tpl.Paths.RAM {
		t.Errorf("record after compaction: %+v, %v; want a full template", rec.RAMDelta, err)
	}
	b, pages := DeltaPaths(tpl.Paths.RAM)
	if pathExists(pages) {
		t.Errorf("the delta's file outlived the compaction")
	}
	// The base's name stays for the children that map it (their records
	// name it) until gc finds none.
	if !pathExists(b) {
		t.Errorf("compaction removed the base's name that its children's records name")
	}
	s.dropCompactedBase(rec)
	if pathExists(b) {
		t.Errorf("the base's name outlived the compacted template's last child")
	}

	// Removal of a delta template takes its files; a lost delta is lost.
	tpl2 := deltaTemplate(t, s, tpl.Paths.RAM)
	os.Remove(tpl2.RAMDelta.Pages)
	if !TemplateRAMLost(tpl2) {
		t.Error("a delta template without its delta file is not reported lost")
	}
	if err := s.RemoveTemplate(tpl2.ID); err != nil {
		t.Fatal(err)
	}
	if pathExists(tpl2.RAMDelta.Base) {
		t.Errorf("removing a delta template left its base name %s", tpl2.RAMDelta.Base)
	}
}

// A fork killed after its delta was written but before its record said
// so: the delta and the base's name go with the repair (the record holds no
// memory), instead of holding a whole RAM file on tmpfs for as long as the
// template's disk is a layer of the source's chain (which keeps the
// template from gc).
func TestRecoverKilledDeltaFork(t *testing.T) {
	mg, d := newTestManager(t)
	bootFake(t, mg, "src")
	base := filepath.Join(mg.Store.MemDir, "src.ram")
	if err := os.WriteFile(base, bytes.Repeat([]byte{'a'}, 4*testPage), 0o600); err != nil {
		t.Fatal(err)
	}
	tpl := deltaTemplate(t, mg.Store, base)
	b, pages := tpl.RAMDelta.Base, tpl.RAMDelta.Pages
	tpl.HasMemory, tpl.RAMDelta = false, nil // the record as prepareFork wrote it
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	// The disk switch happened: the source's new top reads the frozen disk.
	img, err := os.ReadFile(filepath.Join("overlay", "testdata", "base.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tpl.Paths.Disk, img, 0o644); err != nil {
		t.Fatal(err)
	}
	addMachine(t, mg, "other", StateRunning, "")
	other, err := mg.Store.LoadMachine("other")
	if err != nil {
		t.Fatal(err)
	}
	other.Spec.Disk = tpl.Paths.Disk
	if err := overlay.Create(t.Context(), tpl.Paths.Disk, other.Paths.Disk); err != nil {
		t.Fatal(err)
	}
	if err := mg.Store.SaveMachine(other); err != nil {
		t.Fatal(err)
	}
	d.running["other"] = true
	half := filepath.Join(mg.Store.MemDir, "."+tpl.ID+".ram.tmp-delta")
	if err := os.WriteFile(half, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	abandon(t, mg.Store, journalEntry{Op: "fork", Source: "src", Template: tpl.ID})
	if _, err := mg.List(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{b, pages, half} {
		if pathExists(f) {
			t.Errorf("%s left by the repair of a killed delta fork", f)
		}
	}
	if !pathExists(base) {
		t.Error("the repair removed the source's own RAM file")
	}
	if !pathExists(tpl.Paths.Dir) {
		t.Error("the template went with gc: this test no longer shows the repair")
	}
}

// A push cuts one full RAM file: a delta template is compacted before its
// chunk map is made, and the map's RAM holds base and delta.
func TestChunkedCompactsDelta(t *testing.T) {
	mg, _ := newTestManager(t)
	s := mg.Store
	first, err := s.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(first.Paths.RAM, bytes.Repeat([]byte{'a'}, 4*testPage), 0o400); err != nil {
		t.Fatal(err)
	}
	tpl := deltaTemplate(t, s, first.Paths.RAM)
	os.WriteFile(tpl.Paths.DevState, []byte("devstate"), 0o600)
	os.WriteFile(tpl.Paths.Disk, []byte("disk"), 0o600)
	_, err = mg.chunked(t.Context(), tpl.ID)
	rec, lerr := s.LoadTemplate(tpl.ID)
	if lerr != nil || rec.RAMDelta != nil || !pathExists(tpl.Paths.RAM) {
		t.Fatalf("after chunked (%v): record %+v (%v), RAM file there %v; want a compacted template", err, rec, lerr, pathExists(tpl.Paths.RAM))
	}
}

// A chained delta template: compaction applies the chain oldest first,
// then the delta; ls reports its kind and depth; removal by id takes the
// chain's links, found by name.
func TestDeltaChainTemplateFiles(t *testing.T) {
	s := newTestStore(t)
	first, err := s.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(first.Paths.RAM, bytes.Repeat([]byte{'a'}, 4*testPage), 0o400); err != nil {
		t.Fatal(err)
	}
	older := deltaTemplate(t, s, first.Paths.RAM) // page 1 = 'd'
	tpl := deltaTemplate(t, s, first.Paths.RAM)
	// tpl's own delta: page 1 = 'e' over the older's, page 2 = 'f'.
	f, err := os.OpenFile(tpl.RAMDelta.Pages, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(bytes.Repeat([]byte{'e'}, testPage), testPage)
	f.WriteAt(bytes.Repeat([]byte{'f'}, testPage), 2*testPage)
	f.Close()
	// and an oldest link: page 3 = 'd' from the older template's delta.
	g, _ := os.OpenFile(older.RAMDelta.Pages, os.O_WRONLY, 0)
	g.WriteAt(bytes.Repeat([]byte{'d'}, testPage), 3*testPage)
	g.Close()
	link := tpl.RAMDelta.Pages + ".1"
	if err := os.Link(older.RAMDelta.Pages, link); err != nil {
		t.Fatal(err)
	}
	tpl.RAMDelta.Chain = []string{link}
	if err := s.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	if st := deltaStats(tpl); st.Kind != "delta" || st.Depth != 2 || st.AloneBytes != 2*testPage {
		t.Errorf("ls of a chain of 2: %+v; want delta, depth 2, its own 2 pages alone", st)
	}
	if err := s.RemoveTemplate(older.ID); err != nil {
		t.Fatal(err)
	}
	if TemplateRAMLost(tpl) {
		t.Error("the chain was lost with the template it came from")
	}
	if st := deltaStats(tpl); st.AloneBytes != 4*testPage {
		t.Errorf("ls after the older template went: %d bytes alone, want its 2 pages and the link's 2", st.AloneBytes)
	}
	if err := s.CompactRAM(t.Context(), tpl); err != nil {
		t.Fatal(err)
	}
	want := []byte("aefd")
	got, err := os.ReadFile(tpl.Paths.RAM)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		if got[i*testPage] != w {
			t.Errorf("compacted page %d = %c, want %c (the chain oldest first, then the delta)", i, got[i*testPage], w)
		}
	}
	if pathExists(link) {
		t.Errorf("the chain's link outlived the compaction")
	}
	if st := deltaStats(tpl); st.Kind != "full" || st.Depth != 0 {
		t.Errorf("ls after compaction: %+v, want full", st)
	}
	tpl2 := deltaTemplate(t, s, tpl.Paths.RAM)
	l2 := tpl2.RAMDelta.Pages + ".1"
	os.WriteFile(l2, []byte("x"), 0o400)
	if err := s.RemoveTemplate(tpl2.ID); err != nil {
		t.Fatal(err)
	}
	if pathExists(l2) {
		t.Errorf("removing a template left its chain link %s", l2)
	}
}

// template compact: a delta template by id becomes a full file (depth and
// bytes reported), a second compact finds a full file, and an unknown
// name is not found.
func TestCompactTemplateVerb(t *testing.T) {
	mg, _ := newTestManager(t)
	s := mg.Store
	first, err := s.NewTemplate("src")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(first.Paths.RAM, bytes.Repeat([]byte{'a'}, 4*testPage), 0o400); err != nil {
		t.Fatal(err)
	}
	tpl := deltaTemplate(t, s, first.Paths.RAM)
	res, err := mg.CompactTemplate(t.Context(), tpl.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Compacted || res.Depth != 1 || res.WrittenBytes != 5*testPage {
		t.Errorf("compact: %+v, want a depth-1 delta compacted, the base's 4 pages and the delta's 1 written", res)
	}
	if rec, err := s.LoadTemplate(tpl.ID); err != nil || rec.RAMDelta != nil {
		t.Errorf("record after compact: %+v, %v", rec, err)
	}
	res, err = mg.CompactTemplate(t.Context(), tpl.ID)
	if err != nil || res.Compacted {
		t.Errorf("a second compact: %+v, %v; want nothing to do", res, err)
	}
	if _, err := mg.CompactTemplate(t.Context(), "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("compact of nothing: %v, want not found", err)
	}
}
