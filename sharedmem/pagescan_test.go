package sharedmem

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestPrivateRunsBothWays maps a file privately in this process, writes
// some of its pages and reads others, and checks that PAGEMAP_SCAN and the
// page map find the same runs: exactly the written pages.
func TestPrivateRunsBothWays(t *testing.T) {
	const pages = 256
	path := filepath.Join(t.TempDir(), "ram")
	if err := os.WriteFile(path, make([]byte, pages*pageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, pages*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for _, p := range []int{0, 5, 6, 7, 100, pages - 1} {
		mem[p*pageSize] = 1 // a private copy
	}
	var sink byte
	for _, p := range []int{1, 2, 50, 101} {
		sink += mem[p*pageSize] // a file page, only read
	}
	_ = sink
	start := uintptr(unsafe.Pointer(&mem[0]))
	m := Mapping{PID: os.Getpid(), Start: start, End: start + pages*pageSize}
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	want := [][2]int64{{0, 1}, {5, 3}, {100, 1}, {pages - 1, 1}}
	collect := func(runs *[][2]int64) func(first, n int64) error {
		return func(first, n int64) error { *runs = append(*runs, [2]int64{first, n}); return nil }
	}
	var read [][2]int64
	if err := readPrivate(t.Context(), pm, m, collect(&read)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(read, want) {
		t.Errorf("page map: runs %v, want %v", read, want)
	}
	var scanned [][2]int64
	err = scanPrivate(pm, uint64(m.Start), uint64(m.End), collect(&scanned))
	if errors.Is(err, errNoPagemapScan) {
		t.Logf("this kernel has no PAGEMAP_SCAN; only the page map was checked")
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(scanned, want) {
		t.Errorf("PAGEMAP_SCAN: runs %v, want %v", scanned, want)
	}
}
