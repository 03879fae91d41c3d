package sharedmem

import (
	"context"
	"fmt"
	"os"
	"strconv"
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
// process's own writes (copy-on-write copies, found in /proc/PID/pagemap:
// present and not a file page, or swapped out) into dst at the same file
// offsets. Every other page of m shows the mapped file, so when dst already
// holds that file's contents, dst then holds exactly what the process sees.
// The process must not write meanwhile (a paused guest). The cost follows
// the pages written since the mapping was made, not the mapping's size: the
// page map is 8 bytes per 4 KiB page.
func CopyPrivate(ctx context.Context, m Mapping, dst *os.File) (st DiffStats, err error) {
	st.ScannedBytes = m.Size()
	pm, err := os.Open("/proc/" + strconv.Itoa(m.PID) + "/pagemap")
	if err != nil {
		return st, fmt.Errorf("copy private pages: %w", err)
	}
	defer pm.Close()
	mem, err := os.Open("/proc/" + strconv.Itoa(m.PID) + "/mem")
	if err != nil {
		return st, fmt.Errorf("copy private pages: %w", err)
	}
	defer mem.Close()
	const batch = 64 << 10 // pagemap entries read at once (256 MiB of RAM)
	ents := make([]byte, batch*8)
	buf := make([]byte, 4<<20)
	pages := m.Size() / pageSize
	runStart, runLen := int64(-1), int64(0)
	flush := func() error {
		for runLen > 0 {
			n := min(runLen*pageSize, int64(len(buf)))
			off := runStart * pageSize
			if _, err := mem.ReadAt(buf[:n], int64(m.Start)+off); err != nil {
				return fmt.Errorf("read guest RAM at %#x: %w", off, err)
			}
			if _, err := dst.WriteAt(buf[:n], m.Offset+off); err != nil {
				return fmt.Errorf("write %s: %w", dst.Name(), err)
			}
			st.CopiedBytes += n
			runStart += n / pageSize
			runLen -= n / pageSize
		}
		runStart = -1
		return nil
	}
	for first := int64(0); first < pages; first += batch {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		k := min(batch, pages-first)
		if _, err := pm.ReadAt(ents[:k*8], (int64(m.Start)/pageSize+first)*8); err != nil {
			return st, fmt.Errorf("read page map: %w", err)
		}
		for i := int64(0); i < k; i++ {
			e := le64(ents[i*8:])
			private := e&pmSwapped != 0 || (e&pmPresent != 0 && e&pmFile == 0)
			switch {
			case private && runStart < 0:
				runStart, runLen = first+i, 1
			case private:
				runLen++
			case runStart >= 0:
				if err := flush(); err != nil {
					return st, err
				}
			}
		}
	}
	if runStart >= 0 {
		if err := flush(); err != nil {
			return st, err
		}
	}
	return st, nil
}

func le64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}
