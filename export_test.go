package vmfork

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/vmfork/vmfork/overlay"
)

// keptFake makes a diskless kept template "golden" of source "web" in mg's
// store by hand, with a sparse RAM file, device state and a kernel.
func keptFake(t *testing.T, mg *Manager) *Template {
	t.Helper()
	tpl, err := mg.Store.NewTemplate("web")
	if err != nil {
		t.Fatal(err)
	}
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("kernel image"), 0o600); err != nil {
		t.Fatal(err)
	}
	ram, err := os.Create(tpl.Paths.RAM)
	if err != nil {
		t.Fatal(err)
	}
	ram.Truncate(8 << 20)
	ram.WriteAt(bytes.Repeat([]byte{7}, 4096), 1<<20)
	ram.WriteAt(make([]byte, 8192), 3<<20) // data that is all zeros
	ram.WriteAt([]byte("tail"), 8<<20-4)
	ram.Close()
	if err := os.WriteFile(tpl.Paths.DevState, []byte("device state"), 0o600); err != nil {
		t.Fatal(err)
	}
	tpl.Paths.Disk = ""
	tpl.Name, tpl.Driver, tpl.HasMemory = "golden", mg.Driver.Name(), true
	tpl.Spec = Spec{Kernel: kernel, MemoryMiB: 256, CPUs: 1}
	tpl.Manifest = Manifest{QEMUVersion: "7.2.0", MemoryMiB: 256, CPUs: 1, Devices: []string{"-kernel " + kernel, "-device virtio-rng-pci"}}
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	return tpl
}

// hostDriver is the fake driver that describes its host's QEMU.
type hostDriver struct {
	*linkDriver
	qemu string
}

func (d *hostDriver) HostManifest(ctx context.Context, t *Template) (Manifest, error) {
	m := t.Manifest
	m.QEMUVersion = d.qemu
	return m, nil
}

func exportFake(t *testing.T) (string, *Template) {
	t.Helper()
	mg, _ := newTestManager(t)
	tpl := keptFake(t, mg)
	file := filepath.Join(t.TempDir(), "golden.vmt")
	res, err := mg.Export(t.Context(), ExportRequest{Name: "golden", File: file})
	if err != nil {
		t.Fatal(err)
	}
	if res.ID != tpl.ID || res.Logical < 8<<20 || res.Stored != int64(2*4096+len("device state")+len("kernel image")) || res.Archive <= 0 {
		t.Fatalf("export = %+v, want %s with 8 MiB logical and only the non-zero pages stored", res, tpl.ID)
	}
	return file, tpl
}

// leftovers lists what is in the store besides its empty directories.
func leftovers(t *testing.T, s *Store) []string {
	t.Helper()
	var out []string
	for _, d := range []string{filepath.Join(s.StateDir, dirTemplates), s.MemDir} {
		es, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestExportImportRoundTrip(t *testing.T) {
	file, src := exportFake(t)
	mg, _ := newTestManager(t)
	res, err := mg.Import(t.Context(), ImportRequest{File: file, As: "copy"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := mg.Store.FindKept("copy")
	if err != nil {
		t.Fatal(err)
	}
	if res.ID != got.ID || got.Source != "web" || !got.HasMemory || got.Paths.Disk != "" {
		t.Fatalf("imported %+v as %+v", res, got)
	}
	for _, p := range [][2]string{{src.Paths.RAM, got.Paths.RAM}, {src.Paths.DevState, got.Paths.DevState}, {src.Spec.Kernel, got.Spec.Kernel}} {
		a, _ := os.ReadFile(p[0])
		b, err := os.ReadFile(p[1])
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s (%v)", p[1], p[0], err)
		}
	}
	if alloc, _ := overlay.AllocatedBytes(got.Paths.RAM); alloc > 1<<20 {
		t.Errorf("imported RAM file holds %d bytes, want it sparse", alloc)
	}
	if !strings.HasPrefix(got.Spec.Kernel, got.Paths.Dir) || got.Manifest.Devices[0] != "-kernel "+got.Spec.Kernel {
		t.Errorf("kernel %s, devices %q: want both in the template's directory", got.Spec.Kernel, got.Manifest.Devices)
	}
	if got.Family == "" || got.Family == src.Family {
		t.Errorf("imported family %q (exported %q): want a family of its own", got.Family, src.Family)
	}
	if _, err := mg.Import(t.Context(), ImportRequest{File: file, As: "copy"}); !errors.Is(err, ErrExists) {
		t.Errorf("second import as copy: %v, want ErrExists", err)
	}
}

func TestImportRefusesAndLeavesNothing(t *testing.T) {
	file, _ := exportFake(t)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(data)
	flipped[len(flipped)/2] ^= 0x40
	cases := []struct {
		name, want string
		archive    []byte
		driver     Driver
	}{
		{"flipped byte", "corrupted", flipped, nil},
		{"truncated", "truncated", data[:len(data)*2/3], nil},
		// The last frame's end: only zstd's own checksum catches it.
		{"flipped checksum", "corrupted", flipLast(data), nil},
		{"cut at the end", "truncated", data[:len(data)-3], nil},
		{"not zstd", "corrupted", []byte("plain tar? no: nothing of a zstd frame"), nil},
		{"empty", "", nil, nil},
		{"other driver", `needs driver "fake", this host runs "other"`, data, &namedDriver{newFakeDriver(), "other"}},
		{"other QEMU", `QEMU version "7.2.0", this host has "9.0.0"`, data, &hostDriver{&linkDriver{fakeDriver: newFakeDriver()}, "9.0.0"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mg, _ := newTestManager(t)
			if c.driver != nil {
				mg.Driver = c.driver
			}
			f := filepath.Join(t.TempDir(), "a.vmt")
			if err := os.WriteFile(f, c.archive, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := mg.Import(t.Context(), ImportRequest{File: f})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("import: %v, want an error saying %q", err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
			if l := leftovers(t, mg.Store); len(l) != 0 {
				t.Errorf("the refused import left %v", l)
			}
		})
	}
}

// flipLast flips a bit in data's last byte (the zstd frame's checksum).
func flipLast(data []byte) []byte {
	b := bytes.Clone(data)
	b[len(b)-1] ^= 0x01
	return b
}

// The archive is a plain zstd stream (frame magic, checksums on) around the
// same tar layout as before, so zstd(1) reads it and older archives import.
func TestArchiveIsZstdTar(t *testing.T) {
	file, _ := exportFake(t)
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := zstd.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var names []string
	tr := tar.NewReader(zr)
	for {
		th, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, th.Name)
	}
	want := []string{archiveHeaderName, archiveFilesDir + archRAM, archiveFilesDir + archDevState, archiveFilesDir + archKernel}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("entries %q, want %q", names, want)
	}
	head := make([]byte, 4)
	f.ReadAt(head, 0)
	if !bytes.Equal(head, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		t.Errorf("archive starts % x, want the zstd frame magic", head)
	}
}

type namedDriver struct {
	*fakeDriver
	name string
}

func (d *namedDriver) Name() string { return d.name }

// What an import killed midway left is removed by the next one; what a live
// process stages is not.
func TestSweepStaging(t *testing.T) {
	s := newTestStore(t)
	dead := filepath.Join(s.StateDir, dirTemplates, ".import-999999999-123")
	deadRAM := filepath.Join(s.MemDir, ".import-999999999-456.ram.tmp")
	live := filepath.Join(s.StateDir, dirTemplates, stagingPrefix("export")+"1")
	for _, d := range []string{dead, live} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(deadRAM, []byte("x"), 0o600)
	s.sweepStaging()
	for _, p := range []string{dead, deadRAM} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s is still there", p)
		}
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a live process's staging dir went: %v", err)
	}
}

// Forks from a template need not wait while it is exported: the name's
// lock is held only until its files are open.
func TestExportDoesNotHoldTheLock(t *testing.T) {
	mg, _ := newTestManager(t)
	keptFake(t, mg)
	var lockErr error
	calls := 0
	progress := func(done, total int64) {
		calls++
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		unlock, err := mg.Store.Lock(ctx, "golden")
		if err == nil {
			unlock()
		}
		lockErr = errors.Join(lockErr, err)
	}
	file := filepath.Join(t.TempDir(), "g.vmt")
	if _, err := mg.Export(t.Context(), ExportRequest{Name: "golden", File: file, Progress: progress}); err != nil {
		t.Fatal(err)
	}
	if calls == 0 || lockErr != nil {
		t.Errorf("progress called %d times; taking the template's lock meanwhile: %v", calls, lockErr)
	}
}
