package sharedmem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// A RAM file is mostly holes and zero pages: memory the guest never
// touched, or gave back. Every copy of one finds what to copy here, the
// same way: the data extents that SEEK_DATA and SEEK_HOLE report
// (DataExtents), read in pieces (ReadData), and in them the pages that are
// not all zeros (NonZeroPages). Freeze and CopyMapped copy whole extents;
// a hibernation's copy on disk and an exported archive keep only the
// non-zero pages, which come back as holes.

// readChunk is the most ReadData reads at once: a multiple of pageSize, so
// that an extent's pages start at the same offsets in every piece, and
// small enough that a cancel is noticed quickly.
const readChunk = 1 << 20

// zeroPage is what NonZeroPages compares pages with.
var zeroPage [pageSize]byte

// DataExtents calls fn for each data extent [off, end) of f below size, in
// order, as SEEK_DATA and SEEK_HOLE find them; the rest of f is holes,
// which read as zeros. It returns fn's first error, or ctx's when it ends
// between extents.
func DataExtents(ctx context.Context, f *os.File, size int64, fn func(off, end int64) error) error {
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data after off
		}
		if err != nil {
			return fmt.Errorf("seek data in %s: %w", f.Name(), err)
		}
		if data >= size {
			return nil
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", f.Name(), err)
		}
		if err := fn(data, min(hole, size)); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// ReadData reads f's data extents below size (DataExtents) and calls fn
// with each piece read, at most 1 MiB, and its offset in f. Each piece of
// an extent starts a whole number of pages after the extent's start. p is
// reused once fn returns. It returns fn's first error, or ctx's when it
// ends between pieces.
func ReadData(ctx context.Context, f *os.File, size int64, fn func(off int64, p []byte) error) error {
	buf := make([]byte, readChunk)
	return DataExtents(ctx, f, size, func(off, end int64) error {
		for pos := off; pos < end; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, err := f.ReadAt(buf[:min(int64(len(buf)), end-pos)], pos)
			if n == 0 && err != nil {
				return fmt.Errorf("read %s: %w", f.Name(), err)
			}
			if err := fn(pos, buf[:n]); err != nil {
				return err
			}
			pos += int64(n)
		}
		return nil
	})
}

// NonZeroPages calls fn for each 4 KiB page of p that is not all zeros,
// with the page's offset in p; the last page may be short. It returns fn's
// first error.
func NonZeroPages(p []byte, fn func(off int, page []byte) error) error {
	for i := 0; i < len(p); i += pageSize {
		pg := p[i:min(i+pageSize, len(p))]
		if bytes.Equal(pg, zeroPage[:len(pg)]) {
			continue
		}
		if err := fn(i, pg); err != nil {
			return err
		}
	}
	return nil
}
