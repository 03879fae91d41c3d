package overlay

import (
	"context"
	"fmt"
	"io"
	"os"
)

// IsBlockDevice reports whether path is a block device (a loop device, an
// LVM volume, a disk partition): QEMU opens one with its host_device
// driver, and its size is the device's, not what stat says (0).
func IsBlockDevice(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0
}

// deviceSize is the size in bytes of the block device f is open on:
// stat gives 0 for a device, seeking to its end gives its size (as
// blockdev --getsize64 does, without an ioctl).
func deviceSize(f *os.File) (int64, error) {
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("size of block device %s: %w", f.Name(), err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, fmt.Errorf("size of block device %s: %w", f.Name(), err)
	}
	return n, nil
}

// CommitInto writes what top and the layers between it and base hold
// onto base, with qemu-img commit -b: top stays valid (-b implies -d) and
// reads the same after, the layers between are no longer valid (they read
// through a base that changed). Nothing may have any of them open.
func CommitInto(ctx context.Context, top, base string) error {
	return run(ctx, qemuImg(), "commit", "-q", "-f", "qcow2", "-b", base, top)
}

// fileSize is the size of the image file or block device at path.
func fileSize(path string) (int64, error) {
	if !IsBlockDevice(path) {
		st, err := os.Stat(path)
		if err != nil {
			return 0, err
		}
		return st.Size(), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return deviceSize(f)
}
