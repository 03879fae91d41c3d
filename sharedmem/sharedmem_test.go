package sharedmem

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFreezeKeepsDataAndHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.ram")
	const size = 8 << 20
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	page := bytes.Repeat([]byte{0xab}, 4096)
	for _, off := range []int64{0, 1 << 20, size - 4096} {
		if _, err := f.WriteAt(page, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	dst := filepath.Join(dir, "tpl.ram")
	st, err := Freeze(t.Context(), src, dst)
	if err != nil {
		t.Fatal(err)
	}
	if st.SizeBytes != size {
		t.Errorf("SizeBytes = %d, want %d", st.SizeBytes, size)
	}
	if st.CopiedBytes >= size/2 {
		t.Errorf("CopiedBytes = %d, want only the data extents of an 8 MiB sparse file", st.CopiedBytes)
	}
	a, _ := os.ReadFile(src)
	b, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(a, b) {
		t.Fatalf("frozen file differs from the source (err %v)", err)
	}
	var s unix.Stat_t
	if err := unix.Stat(dst, &s); err != nil {
		t.Fatal(err)
	}
	if s.Blocks*512 >= size/2 {
		t.Errorf("frozen file allocates %d bytes, want it sparse", s.Blocks*512)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o400 {
		t.Errorf("frozen file mode %v, want 0400", fi.Mode().Perm())
	}
	if _, err := Freeze(t.Context(), src, dst); !errors.Is(err, os.ErrExist) {
		t.Errorf("second Freeze to the same file = %v, want ErrExist", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestParseRollup(t *testing.T) {
	in := []byte(`55d0c0a4c000-7ffd8e3f9000 ---p 00000000 00:00 0                          [rollup]
Rss:               94104 kB
Pss:               60312 kB
Pss_Anon:          58000 kB
Shared_Clean:       3000 kB
Shared_Dirty:      20500 kB
Private_Clean:     10004 kB
Private_Dirty:     60600 kB
Referenced:        94104 kB
`)
	r, err := parseRollup(in)
	if err != nil {
		t.Fatal(err)
	}
	want := Rollup{RSS: 94104 << 10, PSS: 60312 << 10, SharedClean: 3000 << 10, SharedDirty: 20500 << 10, PrivateClean: 10004 << 10, PrivateDirty: 60600 << 10}
	if r != want {
		t.Errorf("parseRollup = %+v, want %+v", r, want)
	}
	if _, err := parseRollup([]byte("Rss: 1 kB\n")); err == nil {
		t.Error("parseRollup of a partial file succeeded, want an error")
	}
	if self, err := ReadRollup(os.Getpid()); err != nil || self.RSS == 0 {
		t.Errorf("ReadRollup(self) = %+v, %v; want a non-zero RSS", self, err)
	}
}
