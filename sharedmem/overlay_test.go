//go:build linux && amd64

package sharedmem

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
)

func TestMergeChainAndChooseMapped(t *testing.T) {
	// Three deltas, oldest first, overlapping: the newest holding a page
	// gives it, and each page comes once.
	held := [][]pageRun{
		{{0, 20}, {40, 2}},
		{{10, 5}, {30, 20}},
		{{60, 1}, {5, 2}},
	}
	got, err := mergeChain(64, held)
	if err != nil {
		t.Fatal(err)
	}
	want := []chainRun{
		{pageRun{0, 5}, 0}, {pageRun{5, 2}, 2}, {pageRun{7, 3}, 0}, {pageRun{10, 5}, 1},
		{pageRun{15, 5}, 0}, {pageRun{30, 20}, 1}, {pageRun{60, 1}, 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("mergeChain = %v, want %v", got, want)
	}
	for _, c := range []struct {
		name          string
		min           int64
		max           int
		mapped, other []int // indexes into want
	}{
		{"16 pages", 16, 4096, []int{5}, []int{0, 1, 2, 3, 4, 6}},
		{"4 pages", 4, 4096, []int{0, 3, 4, 5}, []int{1, 2, 6}},
		// The cap keeps the longest, in address order; ties by address.
		{"4 pages, 2 at most", 4, 2, []int{0, 5}, []int{1, 2, 3, 4, 6}},
		{"none", 4, 0, nil, []int{0, 1, 2, 3, 4, 5, 6}},
	} {
		m, o := chooseMapped(got, 64, c.min, c.max)
		var wm, wo []chainRun
		for _, i := range c.mapped {
			wm = append(wm, want[i])
		}
		for _, i := range c.other {
			wo = append(wo, want[i])
		}
		if !reflect.DeepEqual(m, wm) || !reflect.DeepEqual(o, wo) {
			t.Errorf("%s: chooseMapped = %v, %v; want %v, %v", c.name, m, o, wm, wo)
		}
	}
	// A run over the whole region is copied: the base must stay in it.
	if m, _ := chooseMapped([]chainRun{{pageRun{0, 64}, 0}}, 64, 4, 10); len(m) != 0 {
		t.Errorf("a run over the whole region was mapped: %v", m)
	}
	if _, err := mergeChain(1, make([][]pageRun, 1<<16)); err == nil {
		t.Error("mergeChain of 65536 deltas succeeded, want an error")
	}
}

func TestUnionRuns(t *testing.T) {
	got := unionRuns([]pageRun{{10, 2}, {0, 3}, {3, 1}, {11, 4}, {20, 0}, {30, 1}, {29, 1}})
	want := []pageRun{{0, 4}, {10, 5}, {29, 2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("unionRuns = %v, want %v", got, want)
	}
}

// TestFindSplit: a RAM region in pieces (the base with two delta files
// mapped over it) is found by the base's inode or name, with the other
// pieces as overlays and the base's first piece for map_files; pieces whose
// offsets do not continue, or a shared piece, are no region.
func TestFindSplit(t *testing.T) {
	maps := []byte(`7f0000000000-7f0000001000 rw-p 00000000 00:00 0
7f0000001000-7f0000005000 rw-p 00000000 00:1a 77 /dev/shm/m/x.delta.1
7f0000005000-7f0000007000 rw-p 00004000 00:1a 55 /dev/shm/m/t.base.ram (deleted)
7f0000007000-7f0000008000 rw-p 00006000 00:1a 78 /dev/shm/m/x.delta
7f0000008000-7f0000011000 rw-p 00007000 00:1a 55 /dev/shm/m/t.base.ram (deleted)
7f0000011000-7f0000012000 ---p 00000000 00:00 0
7f0000020000-7f0000024000 rw-p 00000000 00:1a 90 /dev/shm/m/y.ram
7f0000024000-7f0000030000 rw-s 00004000 00:1a 91 /dev/shm/m/z.ram
`)
	ms, err := parseMaps(1, maps)
	if err != nil {
		t.Fatal(err)
	}
	size := int64(0x10000)
	for _, isBase := range []func(Mapping) bool{
		func(m Mapping) bool { return m.Inode == 55 },
		func(m Mapping) bool {
			return filepath.Ext(m.Path) == ".ram (deleted)" || filepath.Ext(m.Path) == ".ram"
		},
	} {
		m, ok := findSplit(ms, size, isBase)
		if !ok {
			t.Fatal("findSplit found no region")
		}
		want := []Overlay{{First: 0, Pages: 4, Dev: m.Dev, Inode: 77}, {First: 6, Pages: 1, Dev: m.Dev, Inode: 78}}
		if m.Start != 0x7f0000001000 || m.End != 0x7f0000011000 || m.Offset != 0 || m.Inode != 55 || m.Shared ||
			!reflect.DeepEqual(m.Overlays, want) || m.fileStart != 0x7f0000005000 || m.fileEnd != 0x7f0000007000 {
			t.Errorf("findSplit = %+v, want the base 55 over 0x7f0000001000-0x7f0000011000 with overlays %v", m, want)
		}
	}
	if _, ok := findSplit(ms, size, func(m Mapping) bool { return m.Inode == 90 }); ok {
		t.Error("findSplit took a region of a shared piece and a private one")
	}
	if _, ok := findSplit(ms, size-pageSize, func(m Mapping) bool { return m.Inode == 55 }); ok {
		t.Error("findSplit found a region of the wrong size")
	}
	if _, ok := findSplit(ms, size, func(m Mapping) bool { return m.Inode == 1 }); ok {
		t.Error("findSplit found a region without its base")
	}
}

// deltaFile makes a sparse delta file of helperPages pages holding pages
// (each filled with its byte, the page number in its second byte).
func deltaFile(t *testing.T, path string, pages map[int]byte) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(helperPages * pageSize); err != nil {
		t.Fatal(err)
	}
	for pg, b := range pages {
		p := bytes.Repeat([]byte{b}, pageSize)
		p[1] = byte(pg)
		if _, err := f.WriteAt(p, int64(pg)*pageSize); err != nil {
			t.Fatal(err)
		}
	}
}

// pagesOf is pages first..first+n-1, all set to b.
func pagesOf(first, n int, b byte) map[int]byte {
	m := map[int]byte{}
	for i := first; i < first+n; i++ {
		m[i] = b
	}
	return m
}

func union(ms ...map[int]byte) map[int]byte {
	out := map[int]byte{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// readRAM reads process pid's guest RAM m.
func readRAM(t *testing.T, m Mapping) []byte {
	t.Helper()
	f, err := os.Open("/proc/" + strconv.Itoa(m.PID) + "/mem")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, m.Size())
	if _, err := f.ReadAt(b, int64(m.Start)); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestApplyChainMapped: a child applying a chain of three overlapping
// deltas maps the long runs (at most mapMaxRuns, the longest) and copies the
// rest, and holds exactly what the copying apply gives; FindRAM assembles
// its split region (by inode and by name) with the mapped runs as
// overlays; its own pages include them (CopyPrivate, PrivateBytes); its
// write to an overlay page stays its own, the delta file unchanged.
func TestApplyChainMapped(t *testing.T) {
	rootOnly(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "t.base.ram")
	fillFile(t, base, 'a')
	d := []string{filepath.Join(dir, "t.delta.1"), filepath.Join(dir, "t.delta.2"), filepath.Join(dir, "t.delta")}
	deltaFile(t, d[0], union(pagesOf(0, 20, 1), pagesOf(40, 2, 1)))
	deltaFile(t, d[1], union(pagesOf(10, 5, 2), pagesOf(30, 20, 2)))
	deltaFile(t, d[2], union(pagesOf(60, 1, 3), pagesOf(5, 2, 3)))
	want, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range d {
		b, _ := os.ReadFile(f)
		for pg := 0; pg < helperPages; pg++ {
			if b[pg*pageSize] != 0 {
				copy(want[pg*pageSize:(pg+1)*pageSize], b[pg*pageSize:])
			}
		}
	}
	child := func(name string) (*helper, string) {
		c := filepath.Join(dir, name+".ram")
		fillFile(t, c, 'c')
		return startHelper(t, c, base+":"+d[0]+":"+d[1]+":"+d[2]), c
	}
	// The copying apply, as before the mapped one: every delta written
	// oldest first.
	ref, rc := child("ref")
	if err := MapTemplate(t.Context(), &fakeMonitor{pid: ref.cmd.Process.Pid}, ref.cmd.Process.Pid, rc, base, helperPages*pageSize); err != nil {
		t.Fatal(err)
	}
	rm, err := baseMapping(ref.cmd.Process.Pid, base, helperPages*pageSize)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range d {
		if _, err := ApplyDelta(t.Context(), rm, f); err != nil {
			t.Fatal(err)
		}
	}
	if got := readRAM(t, rm); !bytes.Equal(got, want) {
		t.Fatal("the copying apply does not give base + chain")
	}

	defer func(n int64, k int) { mapMinPages, mapMaxRuns = n, k }(mapMinPages, mapMaxRuns)
	mapMinPages, mapMaxRuns = 4, 3
	h, hc := child("c")
	pid := h.cmd.Process.Pid
	st, err := MapTemplateChain(t.Context(), &fakeMonitor{pid: pid}, pid, hc, base, d, helperPages*pageSize)
	if err != nil {
		t.Fatal(err)
	}
	// Runs ≥ 4 pages: 0-4, 10-14, 15-19, 30-49; the cap keeps 30-49 and
	// the first two of 5 pages.
	if st.MapErr != nil || st.Runs != 7 || st.MappedRuns != 3 || st.MappedBytes != 30*pageSize ||
		st.CopiedBytes != 11*pageSize || st.Bytes != 41*pageSize {
		t.Errorf("MapTemplateChain = %+v; want 7 runs of 41 pages, 3 mapped (30 pages), 11 pages copied", st)
	}
	for _, find := range []func() (Mapping, error){
		func() (Mapping, error) { return FindRAM(pid, helperPages*pageSize, "", inodeOf(t, base)) },
		func() (Mapping, error) { return FindRAM(pid, helperPages*pageSize, ".ram", 0) },
	} {
		m, err := find()
		if err != nil {
			t.Fatal(err)
		}
		wantO := []Overlay{
			{First: 0, Pages: 5, Dev: m.Dev, Inode: inodeOf(t, d[0])},
			{First: 10, Pages: 5, Dev: m.Dev, Inode: inodeOf(t, d[1])},
			{First: 30, Pages: 20, Dev: m.Dev, Inode: inodeOf(t, d[1])},
		}
		if m.Inode != inodeOf(t, base) || m.Shared || !reflect.DeepEqual(m.Overlays, wantO) {
			t.Errorf("FindRAM = %+v; want the base with overlays %v", m, wantO)
		}
		// The base's piece by map_files, not a delta's.
		f, err := m.File(os.O_RDONLY)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := f.Stat()
		f.Close()
		if fi == nil || !os.SameFile(fi, mustStat(t, base)) {
			t.Errorf("Mapping.File opened another file than the base %s", base)
		}
	}
	m, err := FindRAM(pid, helperPages*pageSize, "", inodeOf(t, base))
	if err != nil {
		t.Fatal(err)
	}
	if got := readRAM(t, m); !bytes.Equal(got, want) {
		for pg := 0; pg < helperPages; pg++ {
			if !bytes.Equal(got[pg*pageSize:(pg+1)*pageSize], want[pg*pageSize:(pg+1)*pageSize]) {
				t.Errorf("page %d differs from the copying apply's", pg)
			}
		}
	}

	// Its own pages: the chain's 41 (copied or mapped), each once.
	if n, err := PrivateBytes(t.Context(), m); err != nil || n != 41*pageSize {
		t.Errorf("PrivateBytes = %d, %v; want the chain's 41 pages", n, err)
	}
	h.ask("set 31 99") // an overlay page
	h.ask("set 55 98") // the base's
	if got := h.ask("get 31"); got != "99" {
		t.Errorf("the child's write to an overlay page reads back %s", got)
	}
	if b, _ := os.ReadFile(d[1]); b[31*pageSize] != 2 {
		t.Errorf("the child's write reached the delta file: page 31 = %d", b[31*pageSize])
	}
	runs, err := privateRuns(t.Context(), m)
	if err != nil {
		t.Fatal(err)
	}
	wantRuns := []pageRun{{0, 20}, {30, 20}, {55, 1}, {60, 1}}
	if !reflect.DeepEqual(runs, wantRuns) {
		t.Errorf("privateRuns = %v, want %v", runs, wantRuns)
	}
	// The same, asked within some runs only (a delta's pause): overlays
	// and written pages cut at the runs' edges, overlapping runs once.
	within := []pageRun{{10, 25}, {54, 3}, {20, 5}, {62, 1}, {58, 100}}
	in, err := privateRunsIn(t.Context(), m, within)
	if err != nil {
		t.Fatal(err)
	}
	wantIn := []pageRun{{10, 10}, {30, 5}, {55, 1}, {60, 1}}
	if !reflect.DeepEqual(unionRuns(in), wantIn) {
		t.Errorf("privateRunsIn(%v) = %v, want %v", within, in, wantIn)
	}
	// A freeze of the child (Diff's copy of its base, then its own pages
	// written in): exactly what it sees.
	cp := filepath.Join(dir, "copy.ram")
	out, _, err := CopyMapped(t.Context(), m, cp)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ds, err := CopyPrivate(t.Context(), m, out)
	if err != nil || ds.CopiedBytes != 42*pageSize {
		t.Errorf("CopyPrivate = %+v, %v; want 42 pages", ds, err)
	}
	want[31*pageSize], want[55*pageSize] = 99, 98
	if got, _ := os.ReadFile(cp); !bytes.Equal(got, want) {
		t.Error("the child's base with its own pages written in is not what it sees")
	}
	if got := readRAM(t, m); !bytes.Equal(got, want) {
		t.Error("the child does not see its writes over the chain")
	}
}

func mustStat(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// TestForkMappingChild: a child that mapped a delta is itself forked as a
// delta on the same base, twice, its writes tracked over all the pieces
// of its RAM (the second fork chained): each time the chain compacted is
// exactly what the child sees, its mapped pages and its writes to them
// included.
func TestForkMappingChild(t *testing.T) {
	rootOnly(t)
	dir := t.TempDir()
	const size = helperPages * pageSize
	base := filepath.Join(dir, "t.base.ram")
	fillFile(t, base, 'a')
	d := filepath.Join(dir, "t.delta")
	deltaFile(t, d, pagesOf(10, 20, 5))
	c := filepath.Join(dir, "c.ram")
	fillFile(t, c, 'c')
	h := startHelper(t, c, base+":"+d)
	pid := h.cmd.Process.Pid
	st, err := MapTemplateChain(t.Context(), &fakeMonitor{pid: pid}, pid, c, base, []string{d}, size)
	if err != nil || st.MappedRuns != 1 {
		t.Fatalf("MapTemplateChain = %+v, %v; want the 20 pages mapped in one run", st, err)
	}
	track := filepath.Join(dir, "track.json")
	var chain []string
	fork := func(k int) *Plan {
		t.Helper()
		n := "f" + strconv.Itoa(k)
		r := PlanRequest{
			PID: pid, SizeBytes: size, Shared: true, RAM: c, Own: filepath.Join(dir, "own.ram"),
			Template: filepath.Join(dir, n+".ram"), Temp: filepath.Join(dir, "."+n+".ram.tmp"), Suffix: ".ram",
			Delta: filepath.Join(dir, n+".delta"), Base: filepath.Join(dir, n+".base.ram"), Track: track, Chain: true,
		}
		mon := &fakeMonitor{pid: pid}
		p, err := Prepare(t.Context(), mon, r)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Cleanup(t.Context(), mon)
		if p.Mode != Delta {
			t.Fatalf("fork %d of the mapping child: mode %v, want delta", k, p.Mode)
		}
		if _, err := p.InPause(t.Context(), &PauseWindow{}); err != nil {
			t.Fatal(err)
		}
		if p.TrackErr != nil {
			t.Errorf("fork %d: write tracking: %v", k, p.TrackErr)
		}
		m, err := FindRAM(pid, size, ".ram", 0)
		if err != nil {
			t.Fatal(err)
		}
		full := filepath.Join(dir, n+".full")
		chain = append(p.Chain(), r.Delta)
		if _, err := CompactChain(t.Context(), r.Base, chain, full); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(full); !bytes.Equal(got, readRAM(t, m)) {
			t.Errorf("fork %d: the chain compacted is not what the mapping child sees", k)
		}
		return p
	}
	h.ask("set 40 41")
	if p := fork(1); p.Precopied != 21*pageSize {
		t.Errorf("fork 1 copied %d bytes before the pause, want its 21 own pages (20 mapped)", p.Precopied)
	}
	h.ask("set 12 42") // a mapped page
	h.ask("set 50 43")
	if p := fork(2); !p.Tracked() || len(p.Chain()) != 1 {
		t.Errorf("fork 2: tracked %v, chain %v; want a tracked delta after fork 1's", p.Tracked(), p.Chain())
	}
	if b, _ := os.ReadFile(d); b[12*pageSize] != 5 {
		t.Errorf("the child's write reached its template's delta: page 12 = %d", b[12*pageSize])
	}
}
