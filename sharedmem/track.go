package sharedmem

// Write tracking for delta freezes (delta.go). A source's private pages are
// all it wrote since it was mapped onto its base, so an untracked delta
// writes more in the pause at every fork. With the pages written since the
// last delta's instant known, the next delta is the last one (copied while
// the source runs) with only those pages written over it in the pause, and
// holes punched where a page stopped being private: the pause then follows
// what the guest wrote between two forks, as a full copy's does.
//
// How: userfaultfd write-protect in async mode (Linux 6.7,
// UFFD_FEATURE_WP_ASYNC): the kernel resolves a write to a protected page
// itself, with no handler, and only clears the page's protection, which
// PAGEMAP_SCAN reports as PAGE_IS_WRITTEN and re-arms (PM_SCAN_WP_MATCHING).
// Soft-dirty bits would do the same, but the reference host's kernel is
// built without them (CONFIG_MEM_SOFT_DIRTY unset); uffd-wp it has
// (CONFIG_PTE_MARKER_UFFD_WP). The userfaultfd must belong to QEMU's address
// space, so it is made by calls injected into QEMU's main thread as for the
// remap (remap_linux_amd64.go), with a scratch page mapped in QEMU for the
// ioctl arguments and unmapped after; QEMU never reads the descriptor (no
// event is asked for: the faults are resolved in the kernel). A remap of the
// RAM replaces the registered mapping, and with it the tracking.
//
// What vmfork knows of it is a small file per machine (Track), trusted only
// when every field still matches: the QEMU, the mapping, the base file, and
// the delta file of the instant it was armed at (inode and change time, so
// that a template id used again never passes for the old one). It is made
// invalid before each re-arm and valid again after, so a crash in between
// only costs the next fork a full private-page delta.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// userfaultfd ABI (include/uapi/linux/userfaultfd.h, fs.h).
const (
	uffdUserModeOnly      = 1
	uffdAPI               = 0xAA
	uffdFeatureWPShmem    = 1 << 12 // UFFD_FEATURE_WP_HUGETLBFS_SHMEM
	uffdFeatureWPUnpop    = 1 << 13 // UFFD_FEATURE_WP_UNPOPULATED
	uffdFeatureWPAsync    = 1 << 15 // UFFD_FEATURE_WP_ASYNC
	uffdioAPI             = 0xc018aa3f
	uffdioRegister        = 0xc020aa00
	uffdRegisterModeWP    = 1 << 1
	pmScanWPMatching      = 1 << 0
	pmScanCheckWPAsync    = 1 << 1
	pageIsWritten         = 1 << 1
	uffdFeaturesWanted    = uffdFeatureWPShmem | uffdFeatureWPUnpop | uffdFeatureWPAsync
	trackScratchPageBytes = 4096
)

// Track is the state of one machine's write tracking.
type Track struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
	Dev   uint64 `json:"dev"`
	Inode uint64 `json:"inode"` // the base file the mapping shows
	UFFD  int    `json:"uffd"`  // QEMU's descriptor (for people: never used from here)
	// Pages is the delta file of the instant the tracking was armed at,
	// identified by inode and change time; empty while not armed.
	Pages      string `json:"pages,omitempty"`
	PagesInode uint64 `json:"pages_inode,omitempty"`
	PagesCtime int64  `json:"pages_ctime_ns,omitempty"`
	// Chain is the deltas Pages applies after, oldest first, by the names
	// Pages' template has for them (chain.go); empty for a delta on the
	// base alone.
	Chain []string `json:"chain,omitempty"`
}

func loadTrack(path string) (Track, bool) {
	var t Track
	b, err := os.ReadFile(path)
	if err != nil || json.Unmarshal(b, &t) != nil {
		return Track{}, false
	}
	return t, true
}

func saveTrack(path string, t Track) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("save write tracking: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("save write tracking: %w", err)
	}
	return nil
}

// registeredFor reports whether t's userfaultfd covers mapping m.
func (t Track) registeredFor(m Mapping) bool {
	return t.UFFD > 0 && t.PID == m.PID && t.Start == uint64(m.Start) && t.Dev == m.Dev && t.Inode == m.Inode && !m.Shared
}

// armedAt reports whether t was armed at the instant of delta file pages
// (on m's base, after the deltas of chain), so that the pages written
// since are what differ from it.
func (t Track) armedAt(m Mapping) (pages string, chain []string, ok bool) {
	if !t.registeredFor(m) || t.Pages == "" {
		return "", nil, false
	}
	var st unix.Stat_t
	if err := unix.Stat(t.Pages, &st); err != nil || st.Ino != t.PagesInode || st.Ctim.Nano() != t.PagesCtime {
		return "", nil, false
	}
	for _, c := range t.Chain {
		// The chain's names go with Pages' template, all together.
		if _, err := os.Stat(c); err != nil {
			return "", nil, false
		}
	}
	return t.Pages, t.Chain, true
}

// registerWP makes a userfaultfd in process m.PID and registers m's range
// for async write-protect, with calls injected into its main thread (which
// runs no guest code; vCPU threads may run on). It returns QEMU's
// descriptor. stale, when not -1, is the descriptor of an earlier
// registration whose mapping went (a remap): it is closed in the process
// first if it still is a userfaultfd, so that remaps leave none open. On
// error the process is left as it was but for a closed descriptor number.
func registerWP(m Mapping, stale int) (int, error) {
	type result struct {
		fd  int
		err error
	}
	rc := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // as Remap: the thread exits with its tracer state
		fd, err := registerWPLocked(m, stale)
		rc <- result{fd, err}
	}()
	r := <-rc
	if r.err != nil {
		return -1, fmt.Errorf("track writes of pid %d: %w", m.PID, r.err)
	}
	return r.fd, nil
}

func registerWPLocked(m Mapping, stale int) (fd int, err error) {
	t, err := seize(m.PID)
	if err != nil {
		return -1, err
	}
	defer func() {
		if rerr := t.release(); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	if stale >= 0 && isUFFD(m.PID, stale) {
		// Read while QEMU's main thread is stopped: it cannot have
		// closed and reused the number in between.
		t.call(unix.SYS_CLOSE, uintptr(stale))
	}
	scratch, err := t.call(unix.SYS_MMAP, 0, trackScratchPageBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uintptr(0), 0)
	if err == nil && int64(scratch) < 0 && int64(scratch) > -4096 {
		err = fmt.Errorf("mmap: %w", callErr(scratch))
	}
	if err != nil {
		return -1, err
	}
	defer t.call(unix.SYS_MUNMAP, scratch, trackScratchPageBytes)
	r, err := t.call(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|uffdUserModeOnly)
	if err == nil && int64(r) < 0 {
		err = fmt.Errorf("userfaultfd: %w", callErr(r))
	}
	if err != nil {
		return -1, err
	}
	fd = int(r)
	ok := false
	defer func() {
		if !ok {
			t.call(unix.SYS_CLOSE, uintptr(fd))
		}
	}()
	api := [3]uint64{uffdAPI, uffdFeaturesWanted, 0}
	if err := pokeCall(t, m.PID, scratch, unsafe.Pointer(&api[0]), int(unsafe.Sizeof(api)), unix.SYS_IOCTL, uintptr(fd), uffdioAPI); err != nil {
		return -1, fmt.Errorf("UFFDIO_API (WP_ASYNC needs Linux 6.7): %w", err)
	}
	reg := [4]uint64{uint64(m.Start), uint64(m.Size()), uffdRegisterModeWP, 0}
	if err := pokeCall(t, m.PID, scratch, unsafe.Pointer(&reg[0]), int(unsafe.Sizeof(reg)), unix.SYS_IOCTL, uintptr(fd), uffdioRegister); err != nil {
		return -1, fmt.Errorf("UFFDIO_REGISTER: %w", err)
	}
	ok = true
	return fd, nil
}

// isUFFD reports whether descriptor fd of process pid is a userfaultfd.
func isUFFD(pid, fd int) bool {
	l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + strconv.Itoa(fd))
	return err == nil && l == "anon_inode:[userfaultfd]"
}

// pokeCall writes n bytes at p into the process at addr and has the
// stopped thread run system call nr with args and addr last; a non-zero
// return is an error.
func pokeCall(t *tracee, pid int, addr uintptr, p unsafe.Pointer, n int, nr uintptr, args ...uintptr) error {
	l := []unix.Iovec{{Base: (*byte)(p)}}
	l[0].SetLen(n)
	r := []unix.RemoteIovec{{Base: addr, Len: n}}
	if got, err := unix.ProcessVMWritev(pid, l, r, 0); err != nil || got != n {
		return fmt.Errorf("write call arguments: %d of %d bytes: %v", got, n, err)
	}
	ret, err := t.call(nr, append(args, addr)...)
	if err != nil {
		return err
	}
	if ret != 0 {
		return callErr(ret)
	}
	return nil
}

// armWP write-protects every page of m again and returns nothing: from now
// on PAGE_IS_WRITTEN reports what the process writes after this instant.
func armWP(m Mapping) error {
	pm, err := os.Open("/proc/" + strconv.Itoa(m.PID) + "/pagemap")
	if err != nil {
		return fmt.Errorf("arm write tracking: %w", err)
	}
	defer pm.Close()
	err = scanPages(pm, uint64(m.Start), uint64(m.End), pmScanArg{
		Flags:        pmScanWPMatching | pmScanCheckWPAsync,
		CategoryMask: pageIsWritten, ReturnMask: pageIsWritten,
	}, func(int64, int64) error { return nil })
	if err != nil {
		return fmt.Errorf("arm write tracking: %w", err)
	}
	return nil
}

// takeWritten returns the runs of m written since the last armWP and
// write-protects them again, in one walk of the page tables: a page written
// after its entry was read is reported by the next scan.
func takeWritten(m Mapping) ([]pageRun, error) {
	pm, err := os.Open("/proc/" + strconv.Itoa(m.PID) + "/pagemap")
	if err != nil {
		return nil, fmt.Errorf("take written pages: %w", err)
	}
	defer pm.Close()
	var runs []pageRun
	err = scanPages(pm, uint64(m.Start), uint64(m.End), pmScanArg{
		Flags:        pmScanWPMatching | pmScanCheckWPAsync,
		CategoryMask: pageIsWritten, ReturnMask: pageIsWritten,
	}, func(first, n int64) error { runs = append(runs, pageRun{first, n}); return nil })
	if err != nil {
		return nil, fmt.Errorf("take written pages: %w", err)
	}
	return runs, nil
}

// writtenRuns returns the runs of m written since the last armWP. It fails
// when m is not registered for async write-protect any more.
func writtenRuns(m Mapping) ([]pageRun, error) {
	pm, err := os.Open("/proc/" + strconv.Itoa(m.PID) + "/pagemap")
	if err != nil {
		return nil, err
	}
	defer pm.Close()
	var runs []pageRun
	err = scanPages(pm, uint64(m.Start), uint64(m.End), pmScanArg{
		Flags:        pmScanCheckWPAsync,
		CategoryMask: pageIsWritten, ReturnMask: pageIsWritten,
	}, func(first, n int64) error { runs = append(runs, pageRun{first, n}); return nil })
	return runs, err
}

// privateRuns returns the runs of m's private pages (its overlays among
// them: scanOwn).
func privateRuns(ctx context.Context, m Mapping) ([]pageRun, error) {
	pm, err := os.Open("/proc/" + strconv.Itoa(m.PID) + "/pagemap")
	if err != nil {
		return nil, err
	}
	defer pm.Close()
	var runs []pageRun
	collect := func(first, n int64) error { runs = append(runs, pageRun{first, n}); return nil }
	err = scanOwn(ctx, pm, m, collect)
	return runs, err
}

// privateRunsIn is privateRuns for the pages of within alone. What a
// delta's pause asks is which of the pages written since the last delta,
// and of the pages its chain or file holds, are private: a walk of those
// runs costs what they hold, where one of the whole mapping cost 30-45 ms
// at 4 GiB with the writes tracked (every page never written carries a
// write-protect marker, whose entry scanPrivate reads from the page map:
// notMarkers).
func privateRunsIn(ctx context.Context, m Mapping, within []pageRun) ([]pageRun, error) {
	pm, err := os.Open("/proc/" + strconv.Itoa(m.PID) + "/pagemap")
	if err != nil {
		return nil, err
	}
	defer pm.Close()
	pages := m.Size() / pageSize
	var runs []pageRun
	for _, r := range unionRuns(slices.Clone(within)) {
		if r.first >= pages {
			break
		}
		r.n = min(r.n, pages-r.first)
		sub := m
		sub.Start = m.Start + uintptr(r.first*pageSize)
		sub.End = sub.Start + uintptr(r.n*pageSize)
		sub.Offset = m.Offset + r.first*pageSize
		sub.Overlays = nil
		for _, o := range m.Overlays {
			lo, hi := max(o.First, r.first), min(o.First+o.Pages, r.first+r.n)
			if lo < hi {
				o.First, o.Pages = lo-r.first, hi-lo
				sub.Overlays = append(sub.Overlays, o)
			}
		}
		err := scanOwn(ctx, pm, sub, func(first, n int64) error {
			runs = append(runs, pageRun{r.first + first, n})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return runs, nil
}

// pageSet is a bitmap of a mapping's pages.
type pageSet []uint64

func newPageSet(pages int64, runs []pageRun) pageSet {
	s := make(pageSet, (pages+63)/64)
	for _, r := range runs {
		for i := r.first; i < r.first+r.n; i++ {
			s[i/64] |= 1 << (i % 64)
		}
	}
	return s
}

func (s pageSet) has(i int64) bool { return s[i/64]&(1<<(i%64)) != 0 }

// split returns the parts of runs whose pages are in s (in) and not (out).
func (s pageSet) split(runs []pageRun) (in, out []pageRun) {
	for _, r := range runs {
		for i := r.first; i < r.first+r.n; {
			j, k := i, s.has(i)
			for j < r.first+r.n && s.has(j) == k {
				j++
			}
			if k {
				in = append(in, pageRun{i, j - i})
			} else {
				out = append(out, pageRun{i, j - i})
			}
			i = j
		}
	}
	return in, out
}

// punchRuns makes runs of f (page indexes from offset off) holes again.
func punchRuns(f *os.File, off int64, runs []pageRun) error {
	for _, r := range runs {
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off+r.first*pageSize, r.n*pageSize); err != nil {
			return fmt.Errorf("punch %s: %w", f.Name(), err)
		}
	}
	return nil
}

// dataRuns returns f's data extents as runs of pages from offset off, up
// to size bytes.
func dataRuns(ctx context.Context, f *os.File, off, size int64) ([]pageRun, error) {
	var runs []pageRun
	err := DataExtents(ctx, f, off+size, func(a, b int64) error {
		a = max(a, off)
		if b > a {
			runs = append(runs, pageRun{(a - off) / pageSize, (b - a + pageSize - 1) / pageSize})
		}
		return nil
	})
	return runs, err
}

// Tracked reports whether a Delta freeze wrote only the pages written
// since the last delta's instant.
func (p *Plan) Tracked() bool { return p.tracked }
