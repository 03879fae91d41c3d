package sharedmem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// FreezeStats describes one frozen RAM file.
type FreezeStats struct {
	// SizeBytes is the RAM size (the file's length).
	SizeBytes int64 `json:"size_bytes"`
	// CopiedBytes is how much was allocated in the source and copied.
	CopiedBytes int64 `json:"copied_bytes"`
}

// chunk bounds one copy_file_range call so that a cancel is noticed quickly.
const chunk = 64 << 20

// Freeze copies the RAM file src into a new template file dst, keeping holes,
// and makes it read-only. dst must not exist. The caller keeps the guest
// paused while this runs, so src does not change under the copy.
func Freeze(ctx context.Context, src, dst string) (st FreezeStats, err error) {
	in, err := os.Open(src)
	if err != nil {
		return st, fmt.Errorf("freeze RAM: %w", err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return st, fmt.Errorf("freeze RAM: %w", err)
	}
	st.SizeBytes = fi.Size()
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp")
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return st, fmt.Errorf("freeze RAM: %w", err)
	}
	defer func() {
		out.Close()
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if err := out.Truncate(st.SizeBytes); err != nil {
		return st, fmt.Errorf("freeze RAM: %w", err)
	}
	if st.CopiedBytes, err = copyExtents(ctx, in, out, st.SizeBytes); err != nil {
		return st, fmt.Errorf("freeze RAM %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return st, fmt.Errorf("freeze RAM: %w", err)
	}
	// Read-only as a reminder; QEMU 7.2 still opens it O_RDWR as root, since
	// readonly=on would make guest RAM a ROM (rom=off is QEMU 8.2).
	if err := os.Chmod(tmp, 0o400); err != nil {
		return st, fmt.Errorf("freeze RAM: %w", err)
	}
	if _, err := os.Lstat(dst); err == nil {
		return st, fmt.Errorf("freeze RAM: %s: %w", dst, os.ErrExist)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return st, fmt.Errorf("freeze RAM: %w", err)
	}
	return st, nil
}

// copyExtents copies the data extents of in (DataExtents) to the same
// offsets in out, leaving holes as holes.
func copyExtents(ctx context.Context, in, out *os.File, size int64) (copied int64, err error) {
	err = DataExtents(ctx, in, size, func(data, hole int64) error {
		for pos := data; pos < hole; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(hole-pos, chunk)
			roff, woff := pos, pos
			w, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(n), 0)
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
				// Two file systems (libvirt's RAM dir on disk, the
				// templates on tmpfs): the kernel copies across only
				// between some; copy through memory.
				w, err = copyRange(in, out, pos, n)
			}
			if err != nil {
				return fmt.Errorf("copy_file_range: %w", err)
			}
			if w == 0 {
				return io.ErrUnexpectedEOF
			}
			pos += int64(w)
			copied += int64(w)
		}
		return nil
	})
	return copied, err
}

// CreateEmpty makes a template RAM file of size bytes that holds only holes
// (zeros). It serves a fork point whose device state carries all of RAM.
func CreateEmpty(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o400)
	if err != nil {
		return fmt.Errorf("create RAM file: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("create RAM file: %w", err)
	}
	return f.Close()
}

// copyRange copies n bytes at off from in to out through a buffer.
func copyRange(in, out *os.File, off, n int64) (int, error) {
	buf := make([]byte, min(n, 4<<20))
	done := 0
	for int64(done) < n {
		k := min(n-int64(done), int64(len(buf)))
		r, err := in.ReadAt(buf[:k], off+int64(done))
		if r > 0 {
			if _, werr := out.WriteAt(buf[:r], off+int64(done)); werr != nil {
				return done, werr
			}
			done += r
		}
		if err != nil {
			if errors.Is(err, io.EOF) && r > 0 {
				continue
			}
			return done, err
		}
	}
	return done, nil
}
