// Package testloop makes loop devices for tests, the stand-ins for the LVM
// volumes and partitions a block-device disk is on (docs/ARCHITECTURE.md
// "Block-device disks"): the unit tests of the root package and the
// integration tests in tests/ share it. Only tests import it.
package testloop

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// New makes a loop device on a sparse file of size bytes in a temporary
// directory of t. The device is detached when t ends, on every path, or
// earlier by remove (for a caller done with it before: a crash matrix
// row); remove runs once, whichever comes first. Cleanups run last in,
// first out, so a device made before the caller's environment outlives the
// QEMUs that environment kills. A host that cannot make one (not root, no
// loop driver) gets an error saying why, for the caller to skip (a unit
// test) or fail (an integration test, where a missing prerequisite fails).
func New(t testing.TB, size int64) (dev string, remove func(), err error) {
	t.Helper()
	if os.Geteuid() != 0 {
		return "", nil, errors.New("making a loop device needs root")
	}
	f := filepath.Join(t.TempDir(), "volume.img")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		return "", nil, err
	}
	if err := os.Truncate(f, size); err != nil {
		return "", nil, err
	}
	out, err := exec.Command("losetup", "--find", "--show", f).CombinedOutput()
	if err != nil {
		return "", nil, fmt.Errorf("losetup cannot make a loop device (the loop module is needed: modprobe loop): %v: %s", err, out)
	}
	dev = strings.TrimSpace(string(out))
	var once sync.Once
	remove = func() {
		once.Do(func() {
			if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
				t.Errorf("losetup -d %s: %v: %s", dev, err, out)
			}
			os.Remove(f)
		})
	}
	t.Cleanup(remove)
	return dev, remove, nil
}

// Bytes is n bytes of device dev at off, read on the host.
func Bytes(t testing.TB, dev string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("read %d bytes of %s at %d: %v", n, dev, off, err)
	}
	return b
}
