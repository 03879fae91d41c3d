package overlay

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestTopNames(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"disk.qcow2", "disk.1.qcow2", "disk.2.qcow2", "other.qcow2"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	next, err := NextTop(dir)
	if err != nil || next != filepath.Join(dir, "disk.3.qcow2") {
		t.Fatalf("NextTop = %q, %v; want disk.3.qcow2", next, err)
	}
	// disk.qcow2 is still a layer, under a hard link's name.
	if err := os.Link(filepath.Join(dir, "disk.qcow2"), filepath.Join(dir, "frozen")); err != nil {
		t.Fatal(err)
	}
	chain := []Layer{{Path: filepath.Join(dir, "disk.2.qcow2")}, {Path: filepath.Join(dir, "frozen")}}
	if k := LayerIndex(chain, filepath.Join(dir, "disk.qcow2")); k != 1 {
		t.Errorf("LayerIndex(hard link) = %d, want 1", k)
	}
	RemoveUnchained(dir, chain)
	if got, want := names(t, dir), []string{"disk.2.qcow2", "disk.qcow2", "frozen", "other.qcow2"}; !slices.Equal(got, want) {
		t.Errorf("after RemoveUnchained: got %v, want %v", got, want)
	}
	RemoveOldTops(dir, filepath.Join(dir, "disk.2.qcow2"))
	if got, want := names(t, dir), []string{"disk.2.qcow2", "frozen", "other.qcow2"}; !slices.Equal(got, want) {
		t.Errorf("after RemoveOldTops: got %v, want %v", got, want)
	}
}

// names lists the files in dir, sorted.
func names(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}
