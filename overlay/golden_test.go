package overlay

import (
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/lima-vm/go-qcow2reader/image"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from qemu-img")

// goldenBacking is the backing name the golden overlays record; CreateOn
// and qemu-img -u need no file there.
const goldenBacking = "/var/lib/vmfork/templates/web.1/disk.qcow2"

// goldenCases are the overlays testdata/golden holds, made with qemu-img
// 7.2.22 (QEMU 7.2, Debian 1:7.2+dfsg-7+deb12u18+b3):
//
//	qemu-img create -q -f qcow2 -u -b BACKING -F FORMAT NAME SIZE
//
// and gzipped (they are mostly holes). Go's writer makes the same bytes.
var goldenCases = []struct {
	format image.Type
	size   int64
}{
	{"qcow2", 0},
	{"qcow2", 1000}, // rounded up to a sector, as qemu-img does
	{"qcow2", 64 * mib},
	{"raw", 64 * mib},
	{"qcow2", gib},
	{"qcow2", 3 * tib}, // 6144 L1 entries: most of an L1 cluster
	{"raw", 5 * tib},   // 10240 entries: L1 spans two clusters
	{"qcow2", MaxVirtualSize},
}

func goldenPath(format image.Type, size int64) string {
	return filepath.Join("testdata", "golden", fmt.Sprintf("%s-%d.qcow2.gz", format, size))
}

// TestCreateOnGolden holds the Go writer to qemu-img's bytes on a host
// without QEMU's tools too (TestCreateOnLikeQemuImg needs them). Where
// qemu-img is installed it also checks that the goldens are still what it
// makes; -update rewrites them from it.
func TestCreateOnGolden(t *testing.T) {
	dir := t.TempDir()
	_, noQemu := exec.LookPath("qemu-img")
	if *update && noQemu != nil {
		t.Fatalf("-update needs qemu-img: %v", noQemu)
	}
	for _, c := range goldenCases {
		name := fmt.Sprintf("%s-%d", c.format, c.size)
		golden := goldenPath(c.format, c.size)
		if noQemu == nil {
			theirs := filepath.Join(dir, name+".qemu.qcow2")
			qemuTool(t, "qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", goldenBacking, "-F", string(c.format), theirs, fmt.Sprint(c.size))
			if *update {
				writeGzip(t, golden, readFile(t, theirs))
			} else if !bytes.Equal(readGzip(t, golden), readFile(t, theirs)) {
				t.Errorf("%s: qemu-img no longer makes %s (rewrite it with go test ./overlay -run Golden -update, and review)", name, golden)
			}
		}
		mine := filepath.Join(dir, name+".go.qcow2")
		if err := CreateOn(t.Context(), goldenBacking, c.format, c.size, mine); err != nil {
			t.Fatal(err)
		}
		if got, want := readFile(t, mine), readGzip(t, golden); !bytes.Equal(got, want) {
			t.Errorf("%s: CreateOn made %d bytes that differ from %s (%d bytes, qemu-img's)", name, len(got), golden, len(want))
		}
	}
}

func readGzip(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}

func writeGzip(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	zw.Write(data)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
