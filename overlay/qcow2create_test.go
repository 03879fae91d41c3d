package overlay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/lima-vm/go-qcow2reader/image"
)

// These tests hold the Go writer to what QEMU makes of its files: qemu-img
// and qemu-io (Debian's qemu-utils, 7.2) read, check and write them.

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
	tib = int64(1) << 40
)

// needQemu skips the test when QEMU's tools are not installed.
func needQemu(t testing.TB) {
	t.Helper()
	for _, tool := range []string{"qemu-img", "qemu-io"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
}

// qemuTool runs a QEMU tool and returns its output; it fails the test on a
// non-zero exit.
func qemuTool(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// qemuInfo is the output of qemu-img info --output json.
func qemuInfo(t testing.TB, path string) map[string]any {
	t.Helper()
	var info map[string]any
	if err := json.Unmarshal([]byte(qemuTool(t, "qemu-img", "info", "--output", "json", path)), &info); err != nil {
		t.Fatalf("qemu-img info %s: %v", path, err)
	}
	return info
}

// checkClean runs qemu-img check, which exits 0 only when the image has no
// corruptions, leaks or check errors.
func checkClean(t testing.TB, path string) {
	t.Helper()
	if out := qemuTool(t, "qemu-img", "check", path); !strings.Contains(out, "No errors were found") {
		t.Errorf("qemu-img check %s:\n%s", path, out)
	}
}

// qemuIO runs qemu-io commands on a qcow2 image. Besides the exit code, a
// failed pattern check is looked for in the output: qemu-io reports it there.
func qemuIO(t testing.TB, format, path string, cmds ...string) {
	t.Helper()
	args := []string{"-f", format}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out := qemuTool(t, "qemu-io", append(args, path)...)
	if strings.Contains(out, "verification failed") || strings.Contains(out, "error") {
		t.Errorf("qemu-io %s %q:\n%s", path, cmds, out)
	}
}

// backings makes a qcow2 and a raw backing image of size bytes, with 0x5a
// in their first 4 MiB.
func backings(t testing.TB, dir string, size int64) map[image.Type]string {
	t.Helper()
	q := filepath.Join(dir, "base.qcow2")
	qemuTool(t, "qemu-img", "create", "-q", "-f", "qcow2", q, fmt.Sprint(size))
	qemuIO(t, "qcow2", q, "write -P 0x5a 0 4M")
	r := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(r, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(r, size); err != nil {
		t.Fatal(err)
	}
	qemuIO(t, "raw", r, "write -P 0x5a 0 4M")
	return map[image.Type]string{"qcow2": q, "raw": r}
}

// infoKeys are the qemu-img info fields a Go-made overlay must share with a
// qemu-made one ("format-specific" holds compat, refcount-bits, compression
// type, lazy refcounts, extended L2, corrupt).
var infoKeys = []string{"format", "virtual-size", "backing-filename", "full-backing-filename", "backing-filename-format", "cluster-size", "format-specific", "dirty-flag"}

func TestCreateOnLikeQemuImg(t *testing.T) {
	needQemu(t)
	dir := t.TempDir()
	for format, backing := range backings(t, dir, 64*mib) {
		for _, size := range []int64{
			0, 1000, // rounded up to a sector, as qemu-img does
			64 * mib, gib,
			3 * tib, // 6144 L1 entries: most of an L1 cluster
			5 * tib, // 10240 entries: L1 spans two clusters
			MaxVirtualSize,
		} {
			name := fmt.Sprintf("%s-%d", format, size)
			mine := filepath.Join(dir, name+".go.qcow2")
			theirs := filepath.Join(dir, name+".qemu.qcow2")
			if err := CreateOn(t.Context(), backing, format, size, mine); err != nil {
				t.Fatal(err)
			}
			qemuTool(t, "qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", backing, "-F", string(format), theirs, fmt.Sprint(size))
			checkClean(t, mine)
			got, want := qemuInfo(t, mine), qemuInfo(t, theirs)
			for _, k := range infoKeys {
				if !reflect.DeepEqual(got[k], want[k]) {
					t.Errorf("%s: qemu-img info %q = %v, qemu-img's overlay has %v", name, k, got[k], want[k])
				}
			}
			data := got["format-specific"].(map[string]any)["data"].(map[string]any)
			if data["compat"] != "1.1" || data["refcount-bits"] != 16.0 {
				t.Errorf("%s: format-specific data = %v, want compat 1.1, refcount-bits 16", name, data)
			}
			// Not required, but worth knowing: for the same arguments
			// the files should be the same bytes (holes read as zeros).
			if a, b := readFile(t, mine), readFile(t, theirs); !bytes.Equal(a, b) {
				t.Logf("%s: not byte-identical to qemu-img's overlay (%d vs %d bytes)", name, len(a), len(b))
			}
		}
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCreateReadWrite(t *testing.T) {
	needQemu(t)
	dir := t.TempDir()
	for format, backing := range backings(t, dir, 64*mib) {
		top := filepath.Join(dir, "top-"+string(format)+".qcow2")
		if err := Create(t.Context(), backing, top); err != nil {
			t.Fatal(err)
		}
		if info := qemuInfo(t, top); info["virtual-size"] != float64(64*mib) || info["backing-filename"] != backing || info["backing-filename-format"] != string(format) {
			t.Errorf("qemu-img info %s = %v, want 64 MiB on %s (%s)", top, info, backing, format)
		}
		// Unwritten, the overlay reads as its backing.
		if out := qemuTool(t, "qemu-img", "compare", backing, top); !strings.Contains(out, "identical") {
			t.Errorf("qemu-img compare %s %s: %s", backing, top, out)
		}
		qemuIO(t, "qcow2", top,
			"write -P 0xab 1M 64k",
			"write -P 0xcd 60M 4k", // past the backing's data
			"read -P 0xab 1M 64k",
			"read -P 0x5a 0 1M",
			"read -P 0x5a 1088k 2944k", // from 1M+64k to 4M
			"read -P 0 4M 56M",
			"read -P 0xcd 60M 4k",
		)
		checkClean(t, top)
		if out := qemuTool(t, "qemu-img", "check", "--output", "json", top); !strings.Contains(out, `"allocated-clusters": 2`) {
			t.Errorf("qemu-img check %s after two writes to two clusters:\n%s", top, out)
		}
		// Chain reads the overlay and what it names.
		chain, err := Chain(top)
		if err != nil {
			t.Fatal(err)
		}
		if len(chain) != 2 || chain[0].Path != top || chain[0].Format != "qcow2" || chain[0].VirtualSize != 64*mib ||
			chain[1].Path != backing || chain[1].Format != format || chain[1].VirtualSize != 64*mib {
			t.Errorf("Chain(%s) = %+v", top, chain)
		}
	}
}

// TestCreateOnBig writes through an overlay's second L1 cluster: guest
// offsets past 4 TiB are mapped by L1 entries 8192 and up.
func TestCreateOnBig(t *testing.T) {
	needQemu(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	qemuTool(t, "qemu-img", "create", "-q", "-f", "qcow2", base, "5T")
	qemuIO(t, "qcow2", base, "write -P 0x5a 4609G 1M")
	top := filepath.Join(dir, "top.qcow2")
	if err := CreateOn(t.Context(), base, "qcow2", 5*tib, top); err != nil {
		t.Fatal(err)
	}
	qemuIO(t, "qcow2", top,
		"write -P 0xab 4608G 64k",
		"write -P 0xcd 1G 64k",
		"read -P 0xab 4608G 64k",
		"read -P 0x5a 4609G 1M",
		"read -P 0 4610G 64k",
		"read -P 0xcd 1G 64k",
		"read -P 0 5119G 1M",
	)
	checkClean(t, top)
	chain, err := Chain(top)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 || chain[0].VirtualSize != 5*tib || chain[1].Path != base {
		t.Errorf("Chain(%s) = %+v", top, chain)
	}
}

// TestCreateRelativeBacking: a relative backing name is recorded as given,
// and read, like QEMU reads it, from the overlay's directory.
func TestCreateRelativeBacking(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "base.img")
	if err := os.WriteFile(raw, make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	top := filepath.Join(dir, "top.qcow2")
	if err := Create(t.Context(), "base.img", top); err != nil {
		t.Fatal(err)
	}
	chain, err := Chain(top)
	if err != nil {
		t.Fatal(err)
	}
	// 1000 bytes of raw backing make a 1024-byte overlay, as with qemu-img.
	if len(chain) != 2 || chain[0].VirtualSize != 1024 || chain[1].Path != raw || chain[1].Format != "raw" {
		t.Errorf("Chain(%s) = %+v", top, chain)
	}
	if !bytes.Contains(readFile(t, top), []byte("\x00base.img\x00")) {
		t.Errorf("%s does not record the backing name as given", top)
	}
	if err := Create(t.Context(), "missing.img", filepath.Join(dir, "m.qcow2")); err == nil || !strings.Contains(err.Error(), "missing.img") {
		t.Errorf("Create on a missing backing = %v, want an error naming it", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "m.qcow2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed Create left its file behind: %v", err)
	}
}

func TestCreateOnRejects(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, backing string
		format        image.Type
		size          int64
	}{
		{"negative size", "/b.qcow2", "qcow2", -1},
		{"too big", "/b.qcow2", "qcow2", MaxVirtualSize + 1},
		{"no backing", "", "qcow2", mib},
		{"long name", "/" + strings.Repeat("b", maxBackingName), "qcow2", mib},
		{"NUL in name", "/b\x00.qcow2", "qcow2", mib},
		{"no format", "/b.qcow2", "", mib},
		{"protocol format", "/b.qcow2", "file", mib},
		{"unknown format", "/b.qcow2", "asif", mib},
	} {
		path := filepath.Join(dir, "top.qcow2")
		err := CreateOn(t.Context(), c.backing, c.format, c.size, path)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: CreateOn = %v, want an error naming %s", c.name, err, path)
		}
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: CreateOn left a file: %v", c.name, err)
		}
	}
	// The longest name qcow2 allows is fine.
	if err := CreateOn(t.Context(), "/"+strings.Repeat("b", maxBackingName-1), "qcow2", mib, filepath.Join(dir, "long.qcow2")); err != nil {
		t.Error(err)
	}
	// An existing file, even a dangling symlink, is never written.
	link := filepath.Join(dir, "link.qcow2")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), link); err != nil {
		t.Fatal(err)
	}
	if err := CreateOn(t.Context(), "/b.qcow2", "qcow2", mib, link); !errors.Is(err, os.ErrExist) {
		t.Errorf("CreateOn over a dangling symlink = %v, want ErrExist", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "nowhere")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CreateOn wrote through a symlink: %v", err)
	}
}

// BenchmarkCreate compares the Go writer with the qemu-img process it
// replaces, on the same 64 MiB qcow2 backing. Each iteration also removes
// its overlay.
func BenchmarkCreate(b *testing.B) {
	needQemu(b)
	dir := b.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	qemuTool(b, "qemu-img", "create", "-q", "-f", "qcow2", base, "64M")
	top := filepath.Join(dir, "top.qcow2")
	for _, c := range []struct {
		name   string
		create func() error
	}{
		{"go", func() error { return Create(b.Context(), base, top) }},
		{"qemu-img", func() error {
			return run(b.Context(), "qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", top)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := c.create(); err != nil {
					b.Fatal(err)
				}
				if err := os.Remove(top); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
