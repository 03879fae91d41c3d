package overlay

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"

	"github.com/lima-vm/go-qcow2reader/image"
	"github.com/lima-vm/go-qcow2reader/image/qcow2"
)

const qcow2Magic = "QFI\xfb"

// checkQcow2Header refuses a file with qcow2's magic whose header does not
// read: go-qcow2reader calls a qcow2 it cannot parse (a version it does not
// know, a cut header) raw, and QEMU would refuse it only later.
func checkQcow2Header(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	defer f.Close()
	b := make([]byte, 8)
	n, _ := io.ReadFull(f, b)
	if n < len(qcow2Magic) || string(b[:len(qcow2Magic)]) != qcow2Magic {
		return nil
	}
	if n < 8 {
		return fmt.Errorf("disk image %s has a qcow2 magic but its header does not read: %d bytes", path, n)
	}
	if v := binary.BigEndian.Uint32(b[4:]); v != 2 && v != 3 {
		return fmt.Errorf("disk image %s has a qcow2 magic but its header does not read: version %d (QEMU reads 2 and 3)", path, v)
	}
	q, err := qcow2.Open(f, skipBacking)
	if err == nil {
		q.Close()
		return nil
	}
	return fmt.Errorf("disk image %s has a qcow2 magic but its header does not read: %w", path, err)
}

// CheckBase says whether path can be a machine's base disk: a qcow2 image
// whose header (and every backing file below it) reads cleanly, or a raw
// image of whole sectors. Anything else — a text file, a truncated or
// corrupted qcow2, another format QEMU would have to be told about — is
// refused with one line naming the file, before anything starts.
func CheckBase(path string) error {
	size, err := fileSize(path)
	if err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	if err := checkQcow2Header(path); err != nil {
		return err
	}
	chain, err := Chain(path)
	if err != nil {
		return fmt.Errorf("disk image %s is not a readable qcow2 or raw image: %w", path, err)
	}
	switch top := chain[0]; top.Format {
	case image.Type("qcow2"):
		for _, l := range chain[1:] {
			if l.Format != "qcow2" && l.Format != "raw" {
				return fmt.Errorf("disk image %s: backing file %s is %s: only qcow2 and raw are supported", path, l.Path, l.Format)
			}
		}
		return nil
	case image.Type("raw"):
		if size == 0 || size%sectorSize != 0 {
			return fmt.Errorf("disk image %s: %d bytes is not a whole number of %d-byte sectors: not a disk image (want qcow2 or raw)",
				path, size, sectorSize)
		}
		return nil
	default:
		return fmt.Errorf("disk image %s is %s: only qcow2 and raw are supported (convert it with qemu-img convert -O qcow2)", path, top.Format)
	}
}
