package overlay

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// A machine's top image is disk.qcow2 in its directory, and after each fork of it the next free
// disk.N.qcow2: QEMU reopens images by the names it knows, so no name QEMU has seen may ever
// point to another file. An earlier top keeps its old name only for the QEMU that knew it, and
// is also its template's frozen disk under the template's name.
const topGlob = "disk*.qcow2"

// NextTop names the overlay a source in dir moves to at its next fork: disk.1.qcow2,
// disk.2.qcow2, ..., the first that does not exist.
func NextTop(dir string) (string, error) {
	for n := 1; n < 1<<20; n++ {
		p := filepath.Join(dir, fmt.Sprintf("disk.%d.qcow2", n))
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			return p, nil
		}
	}
	return "", fmt.Errorf("no free overlay name in %s", dir)
}

// RemoveOldTops removes the top-image names in dir other than top, once no QEMU uses them.
func RemoveOldTops(dir, top string) {
	old, err := filepath.Glob(filepath.Join(dir, topGlob))
	if err != nil {
		return
	}
	for _, p := range old {
		if p != top {
			os.Remove(p)
		}
	}
}

// RemoveUnchained removes the top-image names in dir that are no layer of chain any more (after
// a layer was streamed away). Names of layers still in the chain stay: QEMU may reopen a layer by
// the name it knows.
func RemoveUnchained(dir string, chain []Layer) {
	old, err := filepath.Glob(filepath.Join(dir, topGlob))
	if err != nil {
		return
	}
	for _, p := range old {
		if LayerIndex(chain, p) < 0 {
			os.Remove(p)
		}
	}
}

// FindLayer reads the chain of the disk whose top image is top and returns it with the index of
// the file at path in it, or k <= 0 when path is no layer below the top.
func FindLayer(top, path string) (chain []Layer, k int, err error) {
	if chain, err = Chain(top); err != nil {
		return nil, -1, err
	}
	return chain, LayerIndex(chain, path), nil
}

// LayerIndex returns the index in chain of the file at path, matched by inode (the chain's
// headers and QEMU may name one image differently: hard links), or -1.
func LayerIndex(chain []Layer, path string) int {
	for i, l := range chain {
		if SameFile(l.Path, path) {
			return i
		}
	}
	return -1
}

// SameFile reports whether a and b name the same file.
func SameFile(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}
