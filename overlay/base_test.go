package overlay

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckBase(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	raw := write("disk.raw", make([]byte, 4*sectorSize))
	good := filepath.Join(dir, "good.qcow2")
	if err := Create(t.Context(), raw, good); err != nil {
		t.Fatal(err)
	}
	over := filepath.Join(dir, "over.qcow2")
	if err := Create(t.Context(), good, over); err != nil {
		t.Fatal(err)
	}
	hdr, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	corrupt := append([]byte{}, hdr...)
	corrupt[4], corrupt[5], corrupt[6], corrupt[7] = 0, 0, 0, 9 // version 9
	for _, p := range []string{raw, good, over} {
		if err := CheckBase(p); err != nil {
			t.Errorf("CheckBase(%s) = %v, want nil", filepath.Base(p), err)
		}
	}
	for name, c := range map[string]struct {
		path, says string
	}{
		"text file":      {write("passwd", []byte("root:x:0:0:root:/root:/bin/bash\n")), "not a whole number of 512-byte sectors"},
		"empty":          {write("empty", nil), "not a whole number"},
		"missing":        {filepath.Join(dir, "nope"), "no such file"},
		"bad version":    {write("v9.qcow2", corrupt), "qcow2 magic but its header does not read"},
		"truncated":      {write("short.qcow2", hdr[:40]), "qcow2 magic but its header does not read"},
		"backing absent": {overOnMissing(t, dir), "not a readable qcow2 or raw image"},
	} {
		err := CheckBase(c.path)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: CheckBase = %v, want an error saying %q", name, err, c.says)
		}
	}
}

// overOnMissing makes a qcow2 overlay whose backing file is then removed.
func overOnMissing(t *testing.T, dir string) string {
	base := filepath.Join(dir, "gone.raw")
	if err := os.WriteFile(base, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	over := filepath.Join(dir, "orphan.qcow2")
	if err := Create(t.Context(), base, over); err != nil {
		t.Fatal(err)
	}
	os.Remove(base)
	return over
}

// FuzzCheckBase feeds image headers to the base-disk check: it must answer
// every file with nil or an error, never panic or hang. The seeds are a
// qcow2 overlay, a raw image and junk.
func FuzzCheckBase(f *testing.F) {
	dir := f.TempDir()
	raw := filepath.Join(dir, "seed.raw")
	os.WriteFile(raw, make([]byte, 1024), 0o644)
	q := filepath.Join(dir, "seed.qcow2")
	if err := Create(context.Background(), raw, q); err != nil {
		f.Fatal(err)
	}
	seed, _ := os.ReadFile(q)
	f.Add(seed)
	f.Add(make([]byte, 512))
	f.Add([]byte("QFI\xfb\x00\x00\x00\x03"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "img")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := CheckBase(p); err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("error spans lines: %q", err)
		}
	})
}
