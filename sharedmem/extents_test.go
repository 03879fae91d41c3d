package sharedmem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// sparseFile makes a file of size bytes in a test dir with data written at
// the given offsets; the rest is holes.
func sparseFile(t *testing.T, size int64, writes map[int64][]byte) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "ram"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off, b := range writes {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func filled(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

// extents lists what DataExtents reports for f.
func extents(t *testing.T, f *os.File, size int64) string {
	t.Helper()
	var got [][2]int64
	if err := DataExtents(t.Context(), f, size, func(off, end int64) error {
		got = append(got, [2]int64{off, end})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(got)
}

func TestDataExtents(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name   string
		size   int64
		writes map[int64][]byte
		want   string
	}{
		{"empty", 0, nil, "[]"},
		{"only a hole", 4 * mib, nil, "[]"},
		{"holes around data", 4 * mib, map[int64][]byte{mib: filled(2*pageSize, 1), 3 * mib: filled(pageSize, 2)},
			fmt.Sprint([][2]int64{{mib, mib + 2*pageSize}, {3 * mib, 3*mib + pageSize}})},
		{"data at the end", 2 * mib, map[int64][]byte{2*mib - pageSize: filled(pageSize, 3)},
			fmt.Sprint([][2]int64{{2*mib - pageSize, 2 * mib}})},
		// The last extent ends at the file's end, not at its page's.
		{"size not a multiple of the page", mib + 100, map[int64][]byte{mib + 10: filled(90, 4)},
			fmt.Sprint([][2]int64{{mib, mib + 100}})},
		{"no holes", 3 * pageSize, map[int64][]byte{0: filled(3*pageSize, 5)},
			fmt.Sprint([][2]int64{{0, 3 * pageSize}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := sparseFile(t, tc.size, tc.writes)
			if got := extents(t, f, tc.size); got != tc.want {
				t.Errorf("extents %s, want %s", got, tc.want)
			}
		})
	}
}

// A size below the file's stops the walk there and cuts the extent that
// crosses it.
func TestDataExtentsStopsAtSize(t *testing.T) {
	f := sparseFile(t, 4<<20, map[int64][]byte{0: filled(2*pageSize, 1), 2 << 20: filled(pageSize, 2)})
	if got, want := extents(t, f, pageSize), fmt.Sprint([][2]int64{{0, pageSize}}); got != want {
		t.Errorf("extents %s, want %s", got, want)
	}
}

// ReadData hands over each extent's bytes in 1 MiB pieces at their
// offsets, so that the pieces put together are the file.
func TestReadData(t *testing.T) {
	const size = 5<<20 + 123
	big := make([]byte, 2<<20+3*pageSize)
	for i := range big {
		big[i] = byte(i%251 + 1)
	}
	f := sparseFile(t, size, map[int64][]byte{pageSize: big, size - 50: filled(50, 9)})
	got := make([]byte, size)
	var pieces []string
	err := ReadData(t.Context(), f, size, func(off int64, p []byte) error {
		if len(p) > readChunk {
			t.Errorf("piece at %d is %d bytes, more than %d", off, len(p), readChunk)
		}
		copy(got[off:], p)
		pieces = append(pieces, fmt.Sprint(off, len(p)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(f.Name())
	if !bytes.Equal(got, want) {
		t.Error("the pieces put together differ from the file")
	}
	wantPieces := fmt.Sprint([]string{
		fmt.Sprint(pageSize, readChunk), fmt.Sprint(pageSize+readChunk, readChunk), fmt.Sprint(pageSize+2*readChunk, 3*pageSize),
		fmt.Sprint(size-123, 123), // the last, partial page
	})
	if fmt.Sprint(pieces) != wantPieces {
		t.Errorf("pieces (offset length) %v, want %v", pieces, wantPieces)
	}
}

func TestNonZeroPages(t *testing.T) {
	p := make([]byte, 5*pageSize+100)
	p[pageSize+7] = 1                         // page 1
	copy(p[3*pageSize:], filled(pageSize, 2)) // page 3
	p[5*pageSize+99] = 3                      // the short last page
	var got []string
	if err := NonZeroPages(p, func(off int, pg []byte) error {
		if !bytes.Equal(pg, p[off:off+len(pg)]) {
			t.Errorf("page at %d is not p's bytes there", off)
		}
		got = append(got, fmt.Sprint(off, len(pg)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint([]string{fmt.Sprint(pageSize, pageSize), fmt.Sprint(3*pageSize, pageSize), fmt.Sprint(5*pageSize, 100)})
	if fmt.Sprint(got) != want {
		t.Errorf("non-zero pages (offset length) %v, want %v", got, want)
	}
	// A short last page of zeros is a zero page too.
	if err := NonZeroPages(make([]byte, pageSize+10), func(off int, pg []byte) error {
		t.Errorf("zero page at %d reported", off)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// fn's error and a cancel end every walk at once, with that error.
func TestExtentWalkStops(t *testing.T) {
	f := sparseFile(t, 8<<20, map[int64][]byte{0: filled(3<<20, 1), 5 << 20: filled(pageSize, 2)})
	errStop := errors.New("stop")
	calls := 0
	if err := DataExtents(t.Context(), f, 8<<20, func(off, end int64) error { calls++; return errStop }); !errors.Is(err, errStop) || calls != 1 {
		t.Errorf("DataExtents with a failing fn: %v after %d calls, want %v after 1", err, calls, errStop)
	}
	calls = 0
	if err := ReadData(t.Context(), f, 8<<20, func(off int64, p []byte) error { calls++; return errStop }); !errors.Is(err, errStop) || calls != 1 {
		t.Errorf("ReadData with a failing fn: %v after %d calls, want %v after 1", err, calls, errStop)
	}
	calls = 0
	if err := NonZeroPages(filled(3*pageSize, 1), func(int, []byte) error { calls++; return errStop }); !errors.Is(err, errStop) || calls != 1 {
		t.Errorf("NonZeroPages with a failing fn: %v after %d calls, want %v after 1", err, calls, errStop)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := DataExtents(ctx, f, 8<<20, func(off, end int64) error { t.Error("fn called after the cancel"); return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("DataExtents after a cancel: %v, want context.Canceled", err)
	}
	// A cancel in the middle of an extent stops the reads at the next piece.
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	calls = 0
	err := ReadData(ctx, f, 8<<20, func(off int64, p []byte) error {
		calls++
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("ReadData cancelled in its first piece: %v after %d pieces, want context.Canceled after 1", err, calls)
	}
}

// Freeze copies what DataExtents finds, holes kept, up to a size that is
// not a multiple of the page, and a cancelled one leaves nothing.
func TestFreezeOddSizeAndCancel(t *testing.T) {
	src := sparseFile(t, 3<<20+77, map[int64][]byte{pageSize: filled(pageSize, 1), 3 << 20: filled(77, 2)})
	dst := filepath.Join(t.TempDir(), "frozen")
	st, err := Freeze(t.Context(), src.Name(), dst)
	if err != nil {
		t.Fatal(err)
	}
	if st.SizeBytes != 3<<20+77 || st.CopiedBytes != pageSize+77 {
		t.Errorf("freeze stats %+v, want size %d and %d copied", st, 3<<20+77, pageSize+77)
	}
	a, _ := os.ReadFile(src.Name())
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Error("frozen copy differs")
	}
	out, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if got, want := extents(t, out, st.SizeBytes), extents(t, src, st.SizeBytes); got != want {
		t.Errorf("frozen copy's extents %s, want the source's %s", got, want)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	dst2 := filepath.Join(t.TempDir(), "frozen")
	if _, err := Freeze(ctx, src.Name(), dst2); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled freeze: %v, want context.Canceled", err)
	}
	if _, err := os.Stat(dst2); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a cancelled freeze left %s: %v", dst2, err)
	}
}
