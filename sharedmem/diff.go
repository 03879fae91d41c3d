package sharedmem

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Page flags in /proc/PID/pagemap (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
	pmFile    = 1 << 61 // a file page or shared anonymous page
	pageSize  = 4096
)

// DiffStats says what CopyPrivate found and copied.
type DiffStats struct {
	ScannedBytes int64 `json:"scanned_bytes"` // the mapping's size
	CopiedBytes  int64 `json:"copied_bytes"`  // its private pages
}

// CopyPrivate copies the pages of private file mapping m that hold the
// process's own writes (copy-on-write copies: present and not a file page,
// or swapped out) and its overlays (deltas it mapped, overlay.go) into dst at the same file offsets. Every other page of m
// shows the mapped file, so when dst already holds that file's contents, dst
// then holds exactly what the process sees. The process must not write
// meanwhile (a paused guest). The cost follows the pages written since the
// mapping was made, and the walk of its page tables: PAGEMAP_SCAN where the
// kernel has it (pagescan.go), else the page map, 8 bytes per 4 KiB page.
func CopyPrivate(ctx context.Context, m Mapping, dst *os.File) (st DiffStats, err error) {
	st.ScannedBytes = m.Size()
	pm, err := os.Open("/proc/" + strconv.Itoa(m.PID) + "/pagemap")
	if err != nil {
		return st, fmt.Errorf("copy private pages: %w", err)
	}
	defer pm.Close()
	var runs []pageRun
	collect := func(first, n int64) error {
		runs = append(runs, pageRun{first, n})
		return nil
	}
	if err := scanOwn(ctx, pm, m, collect); err != nil {
		return st, fmt.Errorf("copy private pages: %w", err)
	}
	if len(runs) == 0 {
		return st, nil
	}
	st.CopiedBytes, err = copyRuns(ctx, m, dst, runs)
	return st, err
}

// pageRun is n pages from page first of a mapping.
type pageRun struct{ first, n int64 }

// copyRuns copies runs of m into dst at the same offsets: it maps dst and
// has the kernel copy from the process into that mapping (moveRuns).
func copyRuns(ctx context.Context, m Mapping, dst *os.File, runs []pageRun) (int64, error) {
	mem, err := unix.Mmap(int(dst.Fd()), m.Offset, int(m.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("map %s: %w", dst.Name(), err)
	}
	defer unix.Munmap(mem)
	copied, err := moveRuns(ctx, m, mem, runs, false)
	if err != nil {
		var short shortMove
		if !errors.As(err, &short) {
			err = ptraceDenied(m.PID, err)
		}
		// A page of the paused process that cannot be read: the template
		// would miss it.
		return copied, fmt.Errorf("read guest RAM of pid %d: %w", m.PID, err)
	}
	return copied, nil
}

// shortMove is a process_vm_readv/writev that moved fewer bytes than asked.
type shortMove struct{ got, want int64 }

func (e shortMove) Error() string { return fmt.Sprintf("%d of %d bytes", e.got, e.want) }

// moveRuns copies runs of pages between mem (a mapping of a file from
// m.Offset) and the same pages of process m.PID's mapping m: into the
// process when write, else out of it. The kernel copies up to IOV_MAX runs
// per call with process_vm_writev/readv: the pages a guest writes between
// two forks are scattered (hundreds of short runs for 2 MB), and a read and
// a write per run through /proc/PID/mem cost 2-4x as much (2.7-10 ms
// against 1.6-2.2 ms for 2 MB on the reference host). Copying fewer bytes
// than asked is an error (shortMove): a page left out would be a wrong page.
func moveRuns(ctx context.Context, m Mapping, mem []byte, runs []pageRun, write bool) (int64, error) {
	const iovMax = 1024
	local := make([]unix.Iovec, 0, min(len(runs), iovMax))
	remote := make([]unix.RemoteIovec, 0, min(len(runs), iovMax))
	var moved int64
	for len(runs) > 0 {
		if err := ctx.Err(); err != nil {
			return moved, err
		}
		k := min(len(runs), iovMax)
		local, remote = local[:0], remote[:0]
		var want int64
		for _, r := range runs[:k] {
			off, n := r.first*pageSize, r.n*pageSize
			l := unix.Iovec{Base: &mem[off]}
			l.SetLen(int(n))
			local = append(local, l)
			remote = append(remote, unix.RemoteIovec{Base: m.Start + uintptr(off), Len: int(n)})
			want += n
		}
		var got int
		var err error
		if write {
			got, err = unix.ProcessVMWritev(m.PID, local, remote, 0)
		} else {
			got, err = unix.ProcessVMReadv(m.PID, local, remote, 0)
		}
		if err != nil {
			return moved, err
		}
		moved += int64(got)
		if int64(got) != want {
			return moved, shortMove{int64(got), want}
		}
		runs = runs[k:]
	}
	return moved, nil
}

// readPrivate calls fn with each run of private pages of m found in the page
// map read through pm, as page indexes from m's start: CopyPrivate's way on
// a kernel without PAGEMAP_SCAN.
func readPrivate(ctx context.Context, pm *os.File, m Mapping, fn func(first, n int64) error) error {
	const batch = 64 << 10 // pagemap entries read at once (256 MiB of RAM)
	ents := make([]byte, batch*8)
	pages := m.Size() / pageSize
	runStart, runLen := int64(-1), int64(0)
	flush := func() error {
		err := fn(runStart, runLen)
		runStart, runLen = -1, 0
		return err
	}
	for first := int64(0); first < pages; first += batch {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := min(batch, pages-first)
		if _, err := pm.ReadAt(ents[:k*8], (int64(m.Start)/pageSize+first)*8); err != nil {
			return fmt.Errorf("read page map: %w", err)
		}
		for i := int64(0); i < k; i++ {
			e := le64(ents[i*8:])
			private := (e&pmSwapped != 0 && !isMarker(e)) || (e&pmPresent != 0 && e&pmFile == 0)
			switch {
			case private && runStart < 0:
				runStart, runLen = first+i, 1
			case private:
				runLen++
			case runStart >= 0:
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	if runStart >= 0 {
		return flush()
	}
	return nil
}

func le64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}
