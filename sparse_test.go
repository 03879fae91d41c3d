package vmfork

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var update = flag.Bool("update", false, "rewrite golden files")

const page = 4096

// sparseSamples writes the files of the sparse goldens into dir: holes,
// zero pages inside data extents, data at the very end, sizes that are not
// a multiple of the page, and more data than one 1 MiB read.
func sparseSamples(t *testing.T, dir string) []string {
	t.Helper()
	rnd := rand.New(rand.NewPCG(26, 6))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rnd.UintN(255) + 1) // no zero bytes: no page of it is all zeros
		}
		return b
	}
	type write struct {
		off  int64
		data []byte
	}
	samples := []struct {
		name   string
		size   int64
		writes []write
	}{
		{"empty", 0, nil},
		{"hole", 3 << 20, nil},
		{"middle", 8 << 20, []write{
			{1 << 20, random(3 * page)},
			{1<<20 + 3*page, make([]byte, 2*page)}, // zeros inside the data extent
			{1<<20 + 5*page, random(page)},
			{5 << 20, make([]byte, 64<<10)}, // an extent of zeros only
			{6<<20 + 100, []byte("x")},      // one byte dirties its page
		}},
		{"tail", 2 << 20, []write{{2<<20 - 4*page, random(4 * page)}}},
		{"odd", 3<<20 + 123, []write{
			{1 << 20, make([]byte, 5000)},
			{1<<20 + 5000, random(3000)},
			{3<<20 + 10, random(100)}, // data in the last, partial page
		}},
		{"odd-zero-tail", 1<<20 + 1000, []write{
			{1 << 20, random(page)},
			{1<<20 + page - 10, make([]byte, 1010)}, // the last partial page is allocated zeros
		}},
		{"dense", 3<<20 + 3*page, nil},
	}
	var dense []write
	for p := int64(0); p < 3<<20+3*page; p += page {
		if p/page%7 == 3 {
			dense = append(dense, write{p, make([]byte, page)})
		} else {
			dense = append(dense, write{p, random(page)})
		}
	}
	samples[len(samples)-1].writes = dense
	var paths []string
	for _, s := range samples {
		path := filepath.Join(dir, s.name)
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(s.size); err != nil {
			t.Fatal(err)
		}
		for _, w := range s.writes {
			if _, err := f.WriteAt(w.data, w.off); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	return paths
}

// dataExtentsOf lists path's data extents as SEEK_DATA and SEEK_HOLE see
// them.
func dataExtentsOf(t *testing.T, path string) [][2]int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	var out [][2]int64
	for off := int64(0); off < st.Size(); {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, [2]int64{data, hole - data})
		off = hole
	}
	return out
}

// An export's scan of a file and a hibernation's sparse copy of it keep
// exactly the bytes they kept when testdata/sparse.golden was written: the
// archive's extents and sha256, the tar stream of an archive holding the
// files, and the hibernated RAM's stored bytes, content and holes.
func TestSparseGolden(t *testing.T) {
	dir := t.TempDir()
	paths := sparseSamples(t, dir)
	var got strings.Builder
	hdr := archiveHeader{Format: archiveFormat, Exported: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Template: Template{ID: "golden-1"}}
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		af := archiveFile{Name: filepath.Base(path), file: f}
		if err := scanFile(t.Context(), &af); err != nil {
			t.Fatalf("scan %s: %v", af.Name, err)
		}
		hdr.Files = append(hdr.Files, af)
		fmt.Fprintf(&got, "%s size=%d sha256=%s extents=%v\n", af.Name, af.Size, af.SHA256, af.Extents)

		dst := filepath.Join(dir, af.Name+".hibernated")
		stored, err := copySparse(t.Context(), path, dst, false)
		if err != nil {
			t.Fatalf("copySparse %s: %v", af.Name, err)
		}
		fmt.Fprintf(&got, "%s hibernated stored=%d\n", af.Name, stored)
		a, _ := os.ReadFile(path)
		b, _ := os.ReadFile(dst)
		if !bytes.Equal(a, b) {
			t.Errorf("%s: the hibernated copy differs from its source", af.Name)
		}
		if stored != af.stored() {
			t.Errorf("%s: hibernate stored %d bytes, export %d", af.Name, stored, af.stored())
		}
		// On a file system of 4 KiB blocks the copy's data is exactly the
		// pages written: the non-zero ones, the export's extents.
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err == nil && fs.Bsize == page {
			if ext := dataExtentsOf(t, dst); fmt.Sprint(ext) != fmt.Sprint(af.Extents) && !(len(ext) == 0 && len(af.Extents) == 0) {
				t.Errorf("%s: the hibernated copy's data extents are %v, want %v", af.Name, ext, af.Extents)
			}
		}
	}
	h := sha256.New()
	if err := writeTar(t.Context(), h, &hdr, nil); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&got, "tar sha256=%s\n", hex.EncodeToString(h.Sum(nil)))
	h.Reset()
	if err := writeArchive(t.Context(), h, &hdr, nil); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&got, "archive sha256=%s\n", hex.EncodeToString(h.Sum(nil)))

	golden := filepath.Join("testdata", "sparse.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		t.Errorf("got\n%s\nwant (%s)\n%s", got.String(), golden, want)
	}
}
