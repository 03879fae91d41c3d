package sharedmem

// Delta templates (issue 27). A machine that maps a frozen file privately
// (a source forked before, or a child) holds its RAM as that file plus its
// private pages. Its fork used to copy the whole frozen file before the
// pause and write the private pages into the copy; a delta freeze instead
// gives the template the frozen file itself as its base (a second name, a
// hard link, so the base lives while the delta does, whoever else gives it
// up) and a sparse file holding only the private pages, written in the
// pause as before. The frozen file is not copied and the source is not
// remapped: it goes on mapping the base privately with its private pages.
//
// A delta's base is always a full file, never another delta, because the
// pages a machine holds privately are everything it wrote since it was
// mapped onto that file. A fork of a child of a delta template is again a
// delta on the same base (its private pages are the delta's pages plus its
// own writes). Where the source's writes are tracked (track.go) and the
// consumer applies chains (PlanRequest.Chain), a delta holds only what
// changed since the last one and names the deltas before it (chain.go);
// otherwise it holds all the private pages, and with tracking starts from
// the last delta copied before the pause. Either way, with tracking, the
// pages written since the last delta (or, with none, all the private pages)
// are copied before the pause too (precopy), and the pause writes only what
// the source wrote after that copy. Once the private pages pass the share of the base's data
// (maxDeltaShare, or the number of children), or the pause would write more
// than maxDeltaBytes with no tracking to copy them before it (checked before
// the pause, with the page-table scans, 0.2 ms per 512 MiB), the freeze makes a full file the old way, which
// remaps the source onto it and starts its deltas again from there.
//
// Children of a delta template map the base privately (MapTemplate) and get
// the deltas' pages mapped over it, or written into it, before the device
// state is loaded (overlay.go): they are then a private copy-on-write view of exactly
// the instant's memory, and a child holds the delta's pages privately while
// its siblings share the base.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// maxDeltaShare: a freeze makes a delta only while the private pages
// (what each child of it holds alone, and writes before it runs) times
// max(maxDeltaShare, its children) are at most the base file's data; above
// it, a full file (copied while the source runs, which then starts its
// deltas again) costs less. Measured (docs/DELTAS.md, "Delta chains"):
// a child writes the delta at 1.3-1.7 GB/s, the copy before the pause
// reads 2.3 GB/s, so a single child's whole fork is shorter with the delta
// while it is under ~0.6 of the base; in memory, N children hold N times
// the delta against one more base. Chained deltas (chain.go) no longer grow
// the mem dir with the private pages, which is what kept this at a quarter.
const maxDeltaShare = 2

// cumulativeDeltaShare is maxDeltaShare for a consumer that takes no chains
// (PlanRequest.Chain unset), whose deltas each hold all the private pages.
const cumulativeDeltaShare = 4

// maxDeltaBytes bounds what a delta writes in the pause: about 45 ms on the
// reference host, against 5-12 ms for the pages written since the last fork
// that a full copy's freeze writes. More is allowed where the source's writes
// are tracked: the pre-copy (precopy) then writes it before the pause. (A
// variable for the tests.)
var maxDeltaBytes int64 = 64 << 20

// PrivateBytes returns how many bytes of m are the process's own pages (what
// CopyPrivate would copy now). It reads the page tables while the process
// runs; the count is a snapshot.
func PrivateBytes(ctx context.Context, m Mapping) (int64, error) {
	pm, err := os.Open("/proc/" + strconv.Itoa(m.PID) + "/pagemap")
	if err != nil {
		return 0, fmt.Errorf("count private pages: %w", err)
	}
	defer pm.Close()
	var n int64
	count := func(_, k int64) error { n += k * pageSize; return nil }
	if err := scanOwn(ctx, pm, m, count); err != nil {
		return 0, fmt.Errorf("count private pages: %w", err)
	}
	return n, nil
}

// prepareDelta readies a delta freeze of p's private mapping, while the
// source runs: the base's second name (req.Base) and an empty sparse file
// for the delta (req.Temp + "-delta", renamed to req.Delta in the pause).
// It reports false, having made nothing, when a delta does not pay
// (maxDeltaShare) or the mapped file has no name left to link.
func (p *Plan) prepareDelta(ctx context.Context) (bool, error) {
	base, err := p.m.File(os.O_RDONLY)
	if err != nil {
		return false, err
	}
	defer base.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(base.Fd()), &st); err != nil {
		return false, fmt.Errorf("stat RAM base: %w", err)
	}
	if st.Nlink == 0 {
		return false, nil // no name: linkat cannot give it one
	}
	private, err := PrivateBytes(ctx, p.m)
	if err != nil {
		return false, err
	}
	// What the pause will write: with the source's writes tracked since
	// the last delta, only the pages written since (track.go).
	paused := private
	tr, _ := loadTrack(p.req.Track)
	prev, chain, armed := tr.armedAt(p.m)
	if armed {
		if w, err := writtenRuns(p.m); err == nil {
			paused = runBytes(w)
		} else {
			armed = false
		}
	}
	share := maxDeltaShare
	if !p.req.Chain {
		// Cumulative deltas repeat every private page in each one:
		// kept at a quarter, as before the chains.
		share = cumulativeDeltaShare
	}
	if private*int64(max(share, p.req.Children)) > st.Blocks*512 {
		return false, nil
	}
	tracking := paused > maxDeltaBytes
	if tracking {
		// Too much for the pause, unless it is copied before (precopy),
		// which needs the writes tracked: set up now, else no delta.
		p.prepareTrack(tr)
		if p.track.UFFD <= 0 {
			return false, nil
		}
	}
	// Linked through /proc/self/fd: the name the mapping shows may be gone
	// while others remain (a template's, a removed machine's).
	if err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(base.Fd())), unix.AT_FDCWD, p.req.Base, unix.AT_SYMLINK_FOLLOW); err != nil {
		if !errors.Is(err, unix.EXDEV) {
			return false, fmt.Errorf("name RAM base %s: %w", p.req.Base, err)
		}
		// The source's QEMU runs in a mount namespace of its own (ip
		// netns exec makes one): the file it maps is on that namespace's
		// mount of the same file system, and linkat refuses to link
		// across mounts. Link the name the mapping shows instead, when
		// it still names that file; else make no delta.
		if ok, err := linkSameFile(p.m.Path, p.req.Base, &st); !ok || err != nil {
			return false, err
		}
	}
	p.baseLinked = true
	tmp := p.req.Temp + "-delta"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return false, fmt.Errorf("create RAM delta: %w", err)
	}
	p.delta, p.deltaTmp = f, tmp
	if err := f.Truncate(st.Size); err != nil {
		return false, fmt.Errorf("create RAM delta: %w", err)
	}
	p.DeltaBase = p.m.Path
	if armed && p.req.Chain && len(chain)+1 < maxDeltaDepth {
		// A link in the chain (chain.go): an empty file that gets
		// only what changed since the last delta's instant (most of
		// it copied before the pause: precopy).
		if err := p.linkChain(ctx, append(chain, prev)); err == nil {
			p.tracked = true
		} else {
			p.TrackErr = err
			p.unlinkChain()
		}
	} else if armed {
		// The last delta (its chain merged into one file), copied while
		// the source runs: the pause writes only what changed since its
		// instant, and the new delta stands on the base alone.
		var n int64
		var err error
		for _, c := range append(chain, prev) {
			var k int64
			if k, err = copyFile(ctx, c, f, st.Size); err != nil {
				break
			}
			n += k
		}
		if err == nil {
			p.tracked, p.Precopied = true, n
		} else {
			p.TrackErr = err
			if err := emptyFile(f, st.Size); err != nil {
				return false, err
			}
		}
	}
	if !tracking {
		p.prepareTrack(tr)
	}
	if p.track.UFFD > 0 {
		if err := p.precopy(ctx, st.Size); err != nil {
			return false, err
		}
	}
	return true, nil
}

// precopy brings the delta file up to the source's present while it runs,
// its writes tracked from that moment on, so that the pause writes only
// the pages written after it (measured on libvirt, docs/DELTAS.md:
// without it a pause wrote 4.9 MB, what a depth chain's level wrote since
// its last fork, or, with no last delta left, 8-9.5 MB, all a child wrote
// since its start, against 2.3 MB for a depth-1 fork written in place):
//
//   - after the last delta was copied (tracked), the pages written since
//     its instant are taken and protected again in one page-table walk
//     (PM_SCAN_WP_MATCHING) and written over it;
//   - for a chained delta (chain.go), the same pages are taken and the
//     private ones copied into the empty delta, which then holds them as
//     the chain's files hold theirs (chainHeld: one no longer private in
//     the pause is written with the base's bytes);
//   - with no last delta to start from (the first delta of this mapping,
//     or the last one removed with its template, as in a chain or loop
//     that removes each child before the next fork), the source is
//     write-protected and all its private pages copied.
//
// The record is made invalid first, so that it never says "armed at" a
// delta whose instant is older than the protection. A failure leaves the
// delta empty, untracked and off the chain (TrackErr says why): the pause then writes all
// the private pages, as without tracking.
func (p *Plan) precopy(ctx context.Context, size int64) error {
	tr := p.track
	tr.Pages, tr.PagesInode, tr.PagesCtime, tr.Chain = "", 0, 0, nil
	if err := saveTrack(p.req.Track, tr); err != nil {
		p.TrackErr = err
		return nil // a tracked delta stays as copied, armed at its instant
	}
	var n int64
	var err error
	if p.tracked && p.chain != nil {
		var w []pageRun
		if w, err = takeWritten(p.m); err == nil {
			n, err = p.copyChained(ctx, w)
		}
	} else if p.tracked {
		var w []pageRun
		if w, err = takeWritten(p.m); err == nil {
			n, err = p.writeWritten(ctx, w)
		}
	} else if err = armWP(p.m); err == nil {
		var st DiffStats
		st, err = CopyPrivate(ctx, p.m, p.delta)
		n = st.CopiedBytes
	}
	if err != nil {
		// The pages written since the last instant may be taken:
		// nothing but all the private pages is known to be right.
		p.TrackErr, p.tracked = err, false
		p.unlinkChain()
		return emptyFile(p.delta, size)
	}
	p.tracked, p.Precopied = true, p.Precopied+n
	return nil
}

// prepareTrack makes sure, while the source runs, that its writes are
// tracked from the next instant on (registered now, armed in the pause).
// Tracking that cannot be had is no error: the next delta then writes all
// the private pages, as without it (TrackErr says why).
func (p *Plan) prepareTrack(tr Track) {
	if p.req.Track == "" {
		return
	}
	if tr.registeredFor(p.m) {
		if _, err := writtenRuns(p.m); err == nil {
			p.track = tr
			return
		}
		// The mapping was replaced under the same file (a remap in
		// place): its registration went with it.
	}
	if os.Geteuid() != 0 {
		// Without CAP_SYS_ADMIN the page map hides swap types, and a
		// write-protect marker could not be told from a private page.
		p.TrackErr = errors.New("write tracking needs root")
		return
	}
	// A registration of this QEMU's that went with a replaced mapping
	// (a remap in place) leaves its descriptor open there: closed now.
	stale := -1
	if tr.PID == p.m.PID && tr.UFFD > 0 {
		stale = tr.UFFD
	}
	fd, err := registerWP(p.m, stale)
	if err != nil {
		p.TrackErr = err
		os.Remove(p.req.Track)
		return
	}
	p.track = Track{PID: p.m.PID, Start: uint64(p.m.Start), Dev: p.m.Dev, Inode: p.m.Inode, UFFD: fd}
	if err := saveTrack(p.req.Track, p.track); err != nil {
		p.TrackErr, p.track = err, Track{}
	}
}

// armTrack re-arms the source's write tracking at the instant of the delta
// just named, in the pause. The record is invalid while arming, so that a
// crash in between costs the next fork a whole delta, never a wrong one.
func (p *Plan) armTrack() {
	if p.track.UFFD <= 0 {
		return
	}
	tr := p.track
	tr.Pages, tr.PagesInode, tr.PagesCtime, tr.Chain = "", 0, 0, nil
	if err := saveTrack(p.req.Track, tr); err != nil {
		p.TrackErr = err
		return
	}
	if err := armWP(p.m); err != nil {
		p.TrackErr = err
		os.Remove(p.req.Track) // registered no more: register again next time
		return
	}
	var st unix.Stat_t
	if err := unix.Stat(p.req.Delta, &st); err != nil {
		p.TrackErr = err
		return
	}
	tr.Pages, tr.PagesInode, tr.PagesCtime, tr.Chain = p.req.Delta, st.Ino, st.Ctim.Nano(), p.chain
	if err := saveTrack(p.req.Track, tr); err != nil {
		p.TrackErr = err
	}
}

// runBytes is the size of runs.
func runBytes(runs []pageRun) int64 {
	var n int64
	for _, r := range runs {
		n += r.n * pageSize
	}
	return n
}

// copyFile copies the data extents of file path into f (size bytes).
func copyFile(ctx context.Context, path string, f *os.File, size int64) (int64, error) {
	in, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	return copyExtents(ctx, in, f, size)
}

// emptyFile makes f size bytes of holes.
func emptyFile(f *os.File, size int64) error {
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("RAM delta: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("RAM delta: %w", err)
	}
	return nil
}

// inPauseDelta writes the paused source's private pages into the delta
// file and gives it its name; the source is left as it is.
func (p *Plan) inPauseDelta(ctx context.Context) (int64, error) {
	n, err := p.writeDelta(ctx)
	if err != nil {
		return n, err
	}
	if err := unix.Fchmod(int(p.delta.Fd()), 0o400); err != nil {
		return n, fmt.Errorf("RAM delta: %w", err)
	}
	// Only a whole delta has the name a template's record points to.
	if err := os.Rename(p.deltaTmp, p.req.Delta); err != nil {
		return n, fmt.Errorf("name RAM delta: %w", err)
	}
	p.deltaTmp, p.baseLinked = "", false
	p.armTrack()
	return n, nil
}

// writeDelta makes the delta file hold exactly the paused source's private
// pages: all of them, or, tracked, the last delta's (already in the file)
// less those no longer private, with the pages written since over them.
func (p *Plan) writeDelta(ctx context.Context) (int64, error) {
	if p.tracked && p.chain != nil {
		n, err := p.writeChained(ctx)
		if err == nil {
			return n, nil
		}
		p.tracked, p.TrackErr = false, err
		p.unlinkChain()
		// It may hold pages copied before the pause (precopy).
		if err := emptyFile(p.delta, p.m.Offset+p.m.Size()); err != nil {
			return 0, err
		}
	} else if p.tracked {
		n, err := p.writeTracked(ctx)
		if err == nil {
			return n, nil
		}
		p.tracked, p.TrackErr = false, err
		if err := emptyFile(p.delta, p.m.Offset+p.m.Size()); err != nil {
			return 0, err
		}
	}
	st, err := CopyPrivate(ctx, p.m, p.delta)
	return st.CopiedBytes, err
}

func (p *Plan) writeTracked(ctx context.Context) (int64, error) {
	written, err := writtenRuns(p.m)
	if err != nil {
		return 0, err
	}
	return p.writeWritten(ctx, written)
}

// writeWritten makes the delta file, which holds the source's private
// pages as of the instant its writes were last protected, hold them as of
// now, given the pages written since.
func (p *Plan) writeWritten(ctx context.Context, written []pageRun) (int64, error) {
	held, err := dataRuns(ctx, p.delta, p.m.Offset, p.m.Size())
	if err != nil {
		return 0, err
	}
	private, err := privateRunsIn(ctx, p.m, append(slices.Clone(written), held...))
	if err != nil {
		return 0, err
	}
	ps := newPageSet(p.m.Size()/pageSize, private)
	// A page the last delta held that is no longer private shows the base
	// again (QEMU discarded it): a hole.
	_, gone := ps.split(held)
	if err := punchRuns(p.delta, p.m.Offset, gone); err != nil {
		return 0, err
	}
	// A page written since and not private is the base's too.
	changed, stale := ps.split(written)
	if err := punchRuns(p.delta, p.m.Offset, stale); err != nil {
		return 0, err
	}
	if len(changed) == 0 {
		return 0, nil
	}
	return copyRuns(ctx, p.m, p.delta, changed)
}

// ApplyDelta writes the data extents of the delta file into the guest RAM
// mapping m of a QEMU that has not run its guest yet (a child, after
// MapTemplate onto the delta's base): the copy a child of a delta template
// made before it mapped the deltas (overlay.go), which still copies the
// short runs (writeRuns). m is a private mapping, so the writes go to the
// child's own copy-on-write pages and never to the base.
//
// Why process_vm_writev: the child's QEMU is stopped at -incoming with no
// vCPU running, so writing into its address space from outside is safe,
// and the kernel copies straight from a mapping of the delta file here into
// the child's pages, up to 1024 extents a call, with no code in QEMU and no
// stream. (The other ways: a RAM stream would need the migration's RAM
// section, which x-ignore-shared leaves out for a share=on block; /proc/PID/mem
// costs a seek and a write per extent.) Measured in docs/DELTAS.md.
func ApplyDelta(ctx context.Context, m Mapping, delta string) (st ApplyStats, err error) {
	start := time.Now()
	f, err := os.Open(delta)
	if err != nil {
		return st, fmt.Errorf("apply RAM delta: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return st, fmt.Errorf("apply RAM delta: %w", err)
	}
	if fi.Size() < m.Offset+m.Size() {
		return st, fmt.Errorf("apply RAM delta %s: %d bytes, the mapping needs %d", delta, fi.Size(), m.Offset+m.Size())
	}
	runs, err := dataRuns(ctx, f, m.Offset, m.Size())
	if err != nil {
		return st, fmt.Errorf("apply RAM delta: %w", err)
	}
	st.Runs = len(runs)
	if len(runs) > 0 {
		st.Bytes, err = writeRuns(ctx, m, f, runs)
		st.CopiedBytes = st.Bytes
	}
	st.Took = time.Since(start)
	return st, err
}

// MapTemplateDelta is MapTemplate for a delta template: the child maps the
// base privately and gets the delta's pages before anything else runs.
func MapTemplateDelta(ctx context.Context, mon Monitor, pid int, start, base, delta string, sizeBytes int64) (ApplyStats, error) {
	return MapTemplateChain(ctx, mon, pid, start, base, []string{delta}, sizeBytes)
}

// baseMapping finds process pid's private mapping of file base.
func baseMapping(pid int, base string, sizeBytes int64) (Mapping, error) {
	var st unix.Stat_t
	if err := unix.Stat(base, &st); err != nil {
		return Mapping{}, fmt.Errorf("apply RAM delta: %w", err)
	}
	m, err := FindRAM(pid, sizeBytes, "", st.Ino)
	if err != nil {
		return Mapping{}, fmt.Errorf("apply RAM delta: %w", err)
	}
	if m.Shared {
		return Mapping{}, fmt.Errorf("apply RAM delta: pid %d maps the base %s shared", pid, base)
	}
	return m, nil
}

// CompactDelta writes base with delta's pages over it into a new full RAM
// file dst (CompactChain with a chain of one).
func CompactDelta(ctx context.Context, base, delta, dst string) (int64, error) {
	return CompactChain(ctx, base, []string{delta}, dst)
}

// compactFiles writes the data of files, each over the ones before, into
// a new file dst the size of the first, made read-only and renamed into
// place only when whole (what reads a template's RAM as one file: export,
// push, template compact).
func compactFiles(ctx context.Context, files []string, dst string) (int64, error) {
	tmp := dst + ".tmp-compact"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return 0, fmt.Errorf("compact RAM delta: %w", err)
	}
	ok := false
	defer func() {
		out.Close()
		if !ok {
			os.Remove(tmp)
		}
	}()
	var n int64
	for i, src := range files {
		in, err := os.Open(src)
		if err != nil {
			return n, fmt.Errorf("compact RAM delta: %w", err)
		}
		fi, err := in.Stat()
		if err == nil && i == 0 {
			err = out.Truncate(fi.Size())
		}
		var k int64
		if err == nil {
			k, err = copyExtents(ctx, in, out, fi.Size())
		}
		in.Close()
		n += k
		if err != nil {
			return n, fmt.Errorf("compact RAM delta %s: %w", src, err)
		}
	}
	if err := out.Chmod(0o400); err != nil {
		return n, fmt.Errorf("compact RAM delta: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return n, fmt.Errorf("compact RAM delta: %w", err)
	}
	ok = true
	return n, nil
}

// linkSameFile links name to newname when name is the file st describes
// (checked again after the link, as the name may have moved meanwhile);
// false, having linked nothing, when it is not.
func linkSameFile(name, newname string, st *unix.Stat_t) (bool, error) {
	same := func() bool {
		var got unix.Stat_t
		return unix.Stat(name, &got) == nil && got.Dev == st.Dev && got.Ino == st.Ino
	}
	if name == "" || !same() {
		return false, nil
	}
	if err := os.Link(name, newname); err != nil {
		return false, fmt.Errorf("name RAM base %s: %w", newname, err)
	}
	var got unix.Stat_t
	if err := unix.Stat(newname, &got); err != nil || got.Dev != st.Dev || got.Ino != st.Ino {
		os.Remove(newname)
		return false, nil
	}
	return true, nil
}
