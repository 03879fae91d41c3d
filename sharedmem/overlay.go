package sharedmem

// Mapped deltas (issue 27). A child of a delta template used to get every
// delta of its chain copied into its memory with process_vm_writev: at the
// 20th fork of a source writing ~30 MB between forks, ~560 MB a child, and
// each sibling held its own copy. Now the child maps the deltas' pages: the
// chain is merged first (each page from the newest delta that holds it),
// and each long run of one delta file is mapped over the base privately
// (MAP_PRIVATE|MAP_FIXED, as the remap maps the base), by mmap calls
// injected into the child's QEMU as for the remap, the file handed to QEMU
// with add-fd as the base is. Siblings then share those pages too, and a
// child's own write to one is copy-on-write as anywhere else in its RAM.
//
// The child's RAM region is then several mappings: pieces of the base
// between pieces of delta files, at contiguous addresses and file offsets
// (the deltas hold their pages at the base's offsets). FindRAM assembles
// them into one Mapping whose Overlays list the pieces of other files, and
// whatever reads a process's own pages (CopyPrivate, PrivateBytes,
// privateRuns: forks, hibernate, checkpoints, the tracked pre-copy) counts
// the overlays as its own, since they are not in the base (scanOwn).
//
// Each mapped run costs one injected call (~55 µs) and
// one or two VMAs (vm.max_map_count is 65530; QEMU has a few hundred of
// its own): runs shorter than mapMinPages are copied as before, and at most
// mapMaxRuns runs are mapped, the longest first.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds of the mapped apply (variables for the tests). An injected mmap
// costs ~55 µs (1000 of them into a helper process: 56 ms, on the 2-core
// reference host beside TCG guests); copying a page costs ~3 µs at the
// apply's 1.3-1.7 GB/s plus its copy-on-write fault, so a run pays mapped
// from about 16 pages (64 KiB). 4096 mappings make at most ~8200 VMAs, an
// eighth of vm.max_map_count, and cost at most ~0.25 s to inject.
var (
	mapMinPages int64 = 16
	mapMaxRuns        = 4096
)

// Overlay is a run of pages of a guest RAM mapping that shows another file
// than the base at the base's offsets: a delta's pages mapped into a child
// (MapTemplateChain). They are the process's own, not the base's.
type Overlay struct {
	First, Pages int64 // from the mapping's start, in pages
	Dev, Inode   uint64
}

// ApplyStats says what a child got of a delta template's chain: Bytes in
// Runs (each page once, from the newest delta holding it), of which
// MappedBytes in MappedRuns were mapped from the delta files and
// CopiedBytes written into its pages.
type ApplyStats struct {
	Bytes       int64         `json:"bytes"`
	Runs        int           `json:"runs"`
	MappedBytes int64         `json:"mapped_bytes"`
	MappedRuns  int           `json:"mapped_runs"`
	CopiedBytes int64         `json:"copied_bytes"`
	Took        time.Duration `json:"took"`
	// MapErr says why a delta file's runs were copied instead of mapped
	// (QEMU could not get or map it: a confined QEMU); nil when none was.
	MapErr error `json:"-"`
}

// LogFields are the "delta applied" debug log's fields of both drivers
// (scripts/delta-forks.sh and TestDeltaForks read them).
func (st ApplyStats) LogFields() map[string]any {
	f := map[string]any{"delta_bytes": st.Bytes, "delta_runs": st.Runs, "delta_mapped_bytes": st.MappedBytes,
		"delta_mapped_runs": st.MappedRuns, "delta_copied_bytes": st.CopiedBytes, "delta_ms": float64(st.Took.Microseconds()) / 1000}
	if st.MapErr != nil {
		f["delta_map_error"] = st.MapErr.Error()
	}
	return f
}

// chainRun is a run of pages held by delta file file (an index).
type chainRun struct {
	pageRun
	file int
}

// mergeChain returns the runs of the chain's files (oldest first) as one
// view: each page from the newest file holding it, maximal runs of one
// file, in address order.
func mergeChain(pages int64, runs [][]pageRun) ([]chainRun, error) {
	if len(runs) >= 1<<16-1 {
		return nil, fmt.Errorf("a chain of %d deltas", len(runs))
	}
	owner := make([]uint16, pages)
	for i, rs := range runs {
		for _, r := range rs {
			for p := r.first; p < min(r.first+r.n, pages); p++ {
				owner[p] = uint16(i + 1)
			}
		}
	}
	var out []chainRun
	for p := int64(0); p < pages; {
		o := owner[p]
		q := p + 1
		for q < pages && owner[q] == o {
			q++
		}
		if o != 0 {
			out = append(out, chainRun{pageRun{p, q - p}, int(o) - 1})
		}
		p = q
	}
	return out, nil
}

// chooseMapped splits runs into those to map (in address order) and those
// to copy: runs of at least minPages, at most maxRuns of them (the longest),
// never one that covers the whole region (the base must stay in it, for
// FindRAM to find it).
func chooseMapped(runs []chainRun, pages, minPages int64, maxRuns int) (mapped, copied []chainRun) {
	var long []int
	for i, r := range runs {
		if r.n >= minPages && r.n < pages {
			long = append(long, i)
		}
	}
	if len(long) > maxRuns {
		sort.SliceStable(long, func(a, b int) bool { return runs[long[a]].n > runs[long[b]].n })
		long = long[:max(maxRuns, 0)]
		sort.Ints(long)
	}
	take := make(map[int]bool, len(long))
	for _, i := range long {
		take[i] = true
	}
	for i, r := range runs {
		if take[i] {
			mapped = append(mapped, r)
		} else {
			copied = append(copied, r)
		}
	}
	return mapped, copied
}

// applyChain gives child mapping m (the base mapped privately, MapTemplate)
// the pages of the delta files deltas, oldest first: the long runs of the
// merged chain mapped, the rest copied (ApplyDelta's way).
func applyChain(ctx context.Context, mon Monitor, m Mapping, deltas []string) (st ApplyStats, err error) {
	start := time.Now()
	defer func() { st.Took = time.Since(start) }()
	files := make([]*os.File, len(deltas))
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	held := make([][]pageRun, len(deltas))
	for i, d := range deltas {
		f, err := os.Open(d)
		if err != nil {
			return st, fmt.Errorf("apply RAM delta: %w", err)
		}
		files[i] = f
		fi, err := f.Stat()
		if err != nil {
			return st, fmt.Errorf("apply RAM delta: %w", err)
		}
		if fi.Size() < m.Offset+m.Size() {
			return st, fmt.Errorf("apply RAM delta %s: %d bytes, the mapping needs %d", d, fi.Size(), m.Offset+m.Size())
		}
		if held[i], err = dataRuns(ctx, f, m.Offset, m.Size()); err != nil {
			return st, fmt.Errorf("apply RAM delta %s: %w", d, err)
		}
	}
	pages := m.Size() / pageSize
	runs, err := mergeChain(pages, held)
	if err != nil {
		return st, fmt.Errorf("apply RAM delta: %w", err)
	}
	st.Runs = len(runs)
	for _, r := range runs {
		st.Bytes += r.n * pageSize
	}
	mapped, copied := chooseMapped(runs, pages, mapMinPages, mapMaxRuns)
	left, err := mapRuns(ctx, mon, m, files, mapped, &st)
	if err != nil {
		return st, err
	}
	copied = append(copied, left...)
	byFile := make([][]pageRun, len(files))
	for _, r := range copied {
		byFile[r.file] = append(byFile[r.file], r.pageRun)
	}
	for i, rs := range byFile {
		if len(rs) == 0 {
			continue
		}
		n, err := writeRuns(ctx, m, files[i], rs)
		st.CopiedBytes += n
		if err != nil {
			return st, err
		}
	}
	return st, nil
}

// writeRuns writes runs of delta file f into the same pages of m.
func writeRuns(ctx context.Context, m Mapping, f *os.File, runs []pageRun) (int64, error) {
	mem, err := unix.Mmap(int(f.Fd()), m.Offset, int(m.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("map %s: %w", f.Name(), err)
	}
	defer unix.Munmap(mem)
	n, err := moveRuns(ctx, m, mem, runs, true)
	if err != nil {
		// A page the child would miss: it must not run.
		return n, fmt.Errorf("write RAM delta %s into pid %d: %w", f.Name(), m.PID, err)
	}
	return n, nil
}

// overlayMap is one mmap injected into the child: a run of a delta file.
type overlayMap struct {
	run chainRun
	fd  int // the file's descriptor in the child's QEMU
}

// mapRuns maps runs over m in m's process: each file that has runs to map
// is handed to QEMU once (add-fd), all the runs are mapped in one stop of
// its main thread, and the descriptors are closed again (remove-fd: the
// mappings hold the files). It returns the runs left to copy: those of a
// file QEMU could not get or may not map (st.MapErr says why).
func mapRuns(ctx context.Context, mon Monitor, m Mapping, files []*os.File, runs []chainRun, st *ApplyStats) (left []chainRun, err error) {
	if len(runs) == 0 {
		return nil, nil
	}
	fds := make(map[int]int)
	for _, r := range runs {
		if _, ok := fds[r.file]; ok {
			continue
		}
		fdset, fd, err := passFD(ctx, mon, files[r.file])
		if err != nil {
			fds[r.file] = -1
			st.MapErr = errors.Join(st.MapErr, fmt.Errorf("pass RAM delta %s: %w", files[r.file].Name(), err))
			continue
		}
		defer removeFD(ctx, mon, fdset)
		fds[r.file] = fd
	}
	var maps []overlayMap
	for _, r := range runs {
		if fd := fds[r.file]; fd >= 0 {
			maps = append(maps, overlayMap{r, fd})
		} else {
			left = append(left, r)
		}
	}
	errc := make(chan error, 1)
	var refused map[int]error
	go func() {
		// As Remap: ptrace from the attaching thread, which exits locked.
		runtime.LockOSThread()
		var err error
		refused, err = injectMaps(m, maps)
		errc <- err
	}()
	if err := <-errc; err != nil {
		return left, fmt.Errorf("map RAM deltas into pid %d: %w", m.PID, err)
	}
	for _, om := range maps {
		if e, ok := refused[om.run.file]; ok {
			left = append(left, om.run)
			if e != nil {
				st.MapErr = errors.Join(st.MapErr, fmt.Errorf("map RAM delta %s: %w", files[om.run.file].Name(), e))
				refused[om.run.file] = nil // said once
			}
			continue
		}
		st.MappedRuns++
		st.MappedBytes += om.run.n * pageSize
	}
	return left, nil
}

// injectMaps makes m's process map each run of maps privately over its RAM,
// at the run's address and the base's offset for it. A file the kernel
// refuses to map (EACCES, EPERM: checked before anything is unmapped) is
// left out from its first refused run on (refused, by file); any other
// failure is an error, after which the child must not run.
func injectMaps(m Mapping, maps []overlayMap) (refused map[int]error, err error) {
	t, err := seize(m.PID)
	if err != nil {
		return nil, ptraceDenied(m.PID, err)
	}
	defer func() {
		if rerr := t.release(); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	refused = map[int]error{}
	for _, om := range maps {
		if _, ok := refused[om.run.file]; ok {
			continue
		}
		addr := m.Start + uintptr(om.run.first*pageSize)
		got, err := t.call(unix.SYS_MMAP, addr, uintptr(om.run.n*pageSize), unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_FIXED|unix.MAP_NORESERVE, uintptr(om.fd), uintptr(m.Offset+om.run.first*pageSize))
		if err != nil {
			return refused, err
		}
		if got == addr {
			continue
		}
		cerr := callErr(got)
		if errors.Is(cerr, unix.EACCES) || errors.Is(cerr, unix.EPERM) {
			refused[om.run.file] = cerr
			continue
		}
		return refused, fmt.Errorf("mmap %d pages at %#x: %w", om.run.n, addr, cerr)
	}
	return refused, nil
}

// findSplit finds, among ms (parseMaps), a guest RAM region of size bytes
// that is several private file mappings at contiguous addresses whose file
// offsets continue one another: the base (the first piece isBase accepts)
// with runs of other files mapped over it (applyChain). The Mapping is the
// base's, over the whole region, with the other pieces as Overlays.
func findSplit(ms []Mapping, size int64, isBase func(Mapping) bool) (Mapping, bool) {
	for i := 0; i < len(ms); i++ {
		j := i + 1
		for j < len(ms) && continues(ms[j-1], ms[j]) {
			j++
		}
		g := ms[i:j]
		i = j - 1
		if len(g) < 2 || int64(g[len(g)-1].End-g[0].Start) != size {
			continue
		}
		b := -1
		for k := range g {
			if isBase(g[k]) {
				b = k
				break
			}
		}
		if b < 0 {
			continue
		}
		m := g[b]
		m.Start, m.End, m.Offset = g[0].Start, g[len(g)-1].End, g[0].Offset
		m.fileStart, m.fileEnd = g[b].Start, g[b].End
		for _, p := range g {
			if p.Inode == g[b].Inode && p.Dev == g[b].Dev {
				continue
			}
			m.Overlays = append(m.Overlays, Overlay{
				First: int64(p.Start-m.Start) / pageSize, Pages: p.Size() / pageSize, Dev: p.Dev, Inode: p.Inode,
			})
		}
		return m, true
	}
	return Mapping{}, false
}

// continues reports whether b is the next piece of a region split as
// applyChain splits one: both private file mappings, b right after a in
// addresses and in file offsets.
func continues(a, b Mapping) bool {
	return a.Inode != 0 && b.Inode != 0 && !a.Shared && !b.Shared &&
		b.Start == a.End && b.Offset == a.Offset+a.Size()
}

// scanOwn calls fn with each run of m's pages that are the process's own
// rather than the base file's, as page indexes from m's start, each page
// once: its private pages (its writes, scanPrivate) and, for a child that
// mapped deltas, the overlays (not in the base either, whether written or
// not). What reads it: CopyPrivate (Diff and delta freezes), PrivateBytes,
// privateRuns (chained deltas, the tracked pre-copy).
func scanOwn(ctx context.Context, pm *os.File, m Mapping, fn func(first, n int64) error) error {
	scan := func(fn func(first, n int64) error) error {
		err := scanPrivate(pm, uint64(m.Start), uint64(m.End), fn)
		if errors.Is(err, errNoPagemapScan) {
			err = readPrivate(ctx, pm, m, fn)
		}
		return err
	}
	if len(m.Overlays) == 0 {
		return scan(fn)
	}
	var runs []pageRun
	if err := scan(func(first, n int64) error { runs = append(runs, pageRun{first, n}); return nil }); err != nil {
		return err
	}
	for _, o := range m.Overlays {
		runs = append(runs, pageRun{o.First, o.Pages})
	}
	for _, r := range unionRuns(runs) {
		if err := fn(r.first, r.n); err != nil {
			return err
		}
	}
	return nil
}

// unionRuns returns the pages of runs (in any order, overlapping or not)
// as sorted, disjoint, maximal runs.
func unionRuns(runs []pageRun) []pageRun {
	sort.Slice(runs, func(a, b int) bool { return runs[a].first < runs[b].first })
	var out []pageRun
	for _, r := range runs {
		if r.n <= 0 {
			continue
		}
		if n := len(out); n > 0 && r.first <= out[n-1].first+out[n-1].n {
			last := &out[n-1]
			last.n = max(last.n, r.first+r.n-last.first)
			continue
		}
		out = append(out, r)
	}
	return out
}
