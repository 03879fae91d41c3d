package overlay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/lima-vm/go-qcow2reader/image"
)

// An empty qcow2 overlay is written here rather than by `qemu-img create`: a
// fork child's overlay is made on its critical path, and the qemu-img process
// alone cost 6-10 ms of a ~60 ms start. The file means what qemu-img 7.2
// writes for `create -f qcow2 -b BACKING -F FMT [SIZE]` with default options
// (for the same arguments the bytes match too). Field names and offsets below
// are those of the qcow2 specification, docs/interop/qcow2.txt in QEMU.
//
// Layout, one 64 KiB cluster each, as qemu-img lays it out:
//
//	cluster 0   header, header extensions, backing file name
//	cluster 1   refcount table: one entry, pointing at cluster 2
//	cluster 2   refcount block: refcount 1 for clusters 0..2 and the L1 table
//	cluster 3.. L1 table, l1_size zero entries (no cluster allocated yet);
//	            the file ends with it, as qemu-img's does
const (
	qcowMagic   = 0x514649fb // "QFI\xfb"
	qcowVersion = 3          // version 3: refcount_order and header_length exist

	// cluster_bits: 64 KiB clusters, qemu-img's default.
	clusterBits = 16
	clusterSize = 1 << clusterBits

	// refcount_order 4: 16-bit refcounts, qemu-img's default. A refcount
	// block (one cluster) then holds clusterSize/2 entries.
	refcountOrder = 4
	refcountBytes = 1 << refcountOrder / 8

	// An L2 table is one cluster of 8-byte entries (no extended L2, which
	// would make entries 16 bytes), so an L1 entry maps
	// 2^(clusterBits + l2Bits) bytes of the guest disk: 512 MiB.
	l2Bits = clusterBits - 3

	// maxL1Entries is QEMU's QCOW_MAX_L1_SIZE (32 MiB of L1 table) in
	// entries: QEMU refuses to open an image with a larger l1_size, so the
	// largest virtual size with 64 KiB clusters is 2^22 * 512 MiB = 2 PiB.
	maxL1Entries = 32 << 20 / 8
	// MaxVirtualSize is the largest virtual size an overlay can have.
	MaxVirtualSize = int64(maxL1Entries) << (clusterBits + l2Bits)

	// sectorSize: qcow2 images hold whole 512-byte sectors; qemu-img rounds
	// a requested size up to it (and takes a raw backing's length rounded
	// up the same way).
	sectorSize = 512

	// headerLength is header_length: the version 3 header through the
	// compression_type byte (offset 104), padded to a multiple of 8 as the
	// spec requires and as qemu-img writes it.
	headerLength = 112

	// maxBackingName: backing_file_size "must not be longer than 1023
	// bytes" (spec).
	maxBackingName = 1023
	// maxBackingFormat: QEMU reads the backing file format extension into
	// a 16-byte, NUL-terminated buffer and rejects a longer one.
	maxBackingFormat = 15

	// Header extension types (spec, "Header extensions").
	extEnd            = 0x00000000
	extBackingFormat  = 0xe2792aca
	extFeatureNameTab = 0x6803f857

	// Feature name table entry: type (1 byte), bit number (1 byte), name
	// (46 bytes, NUL-padded).
	featureNameSize  = 46
	featureEntrySize = 2 + featureNameSize

	// Refcount table entries and L1 entries are 8-byte offsets.
	entrySize = 8
)

// One refcount block, covering clusterSize/refcountBytes clusters (32768:
// 2 GiB of file), is enough: the metadata is 3 clusters and the largest L1
// table 512. This constant does not compile if that stops being true.
const _ = uint(clusterSize/refcountBytes - (3 + maxL1Entries*entrySize/clusterSize))

// Feature types in the feature name table.
const (
	featIncompatible = 0
	featCompatible   = 1
	featAutoclear    = 2
)

// featureNames is the feature name table qemu-img 7.2 writes. No feature
// bit is set in our headers; the table is optional and only lets an older
// QEMU name a feature it does not know when it refuses an image. It is kept
// so that a Go-made overlay reads like a qemu-made one under any tool.
var featureNames = []struct {
	typ, bit byte
	name     string
}{
	{featIncompatible, 0, "dirty bit"},
	{featIncompatible, 1, "corrupt bit"},
	{featIncompatible, 2, "external data file"},
	{featIncompatible, 3, "compression type"},
	{featIncompatible, 4, "extended L2 entries"},
	{featCompatible, 0, "lazy refcounts"},
	{featAutoclear, 0, "bitmaps"},
	{featAutoclear, 1, "raw external data"},
}

// backingFormats are QEMU 7.2's image format drivers: a backing file format
// extension naming anything else (a protocol such as "file", a filter such as
// "throttle", a typo) makes QEMU refuse to open the overlay.
var backingFormats = map[image.Type]bool{
	"bochs": true, "cloop": true, "dmg": true, "luks": true, "parallels": true,
	"qcow": true, "qcow2": true, "qed": true, "raw": true, "vdi": true,
	"vhdx": true, "vmdk": true, "vpc": true,
}

// qcow2Layout is an empty overlay's metadata, computed from its arguments.
type qcow2Layout struct {
	size          int64 // virtual size, whole sectors
	l1Entries     int64 // l1_size
	l1Offset      int64 // l1_table_offset; 0 when l1_size is 0, as qemu-img
	clusters      int64 // clusters holding metadata, each with refcount 1
	fileSize      int64 // the file ends with the L1 table
	cluster0      []byte
	refcountTable []byte // at cluster 1
	refcountBlock []byte // at cluster 2
}

// layoutOverlay checks an overlay's arguments and lays out its metadata.
func layoutOverlay(backing string, format image.Type, size int64) (*qcow2Layout, error) {
	switch {
	case backing == "":
		return nil, errors.New("no backing file")
	case len(backing) > maxBackingName:
		return nil, fmt.Errorf("backing file name is %d bytes, qcow2 allows %d", len(backing), maxBackingName)
	case strings.IndexByte(backing, 0) >= 0:
		// QEMU would read the name up to the NUL: another file.
		return nil, errors.New("backing file name contains a NUL byte")
	case !backingFormats[format] || len(format) > maxBackingFormat:
		return nil, fmt.Errorf("backing format %q is not a QEMU image format", format)
	case size < 0:
		return nil, fmt.Errorf("virtual size %d is negative", size)
	case size > MaxVirtualSize:
		return nil, fmt.Errorf("virtual size %d is over qcow2's %d with %d KiB clusters", size, MaxVirtualSize, clusterSize>>10)
	}
	// Round up to a sector as qemu-img does; MaxVirtualSize is a multiple
	// of it, so this cannot pass the limit.
	size = (size + sectorSize - 1) &^ (sectorSize - 1)

	l := &qcow2Layout{size: size, clusters: 3}
	l.l1Entries = (size + 1<<(clusterBits+l2Bits) - 1) >> (clusterBits + l2Bits)
	l.fileSize = 3*clusterSize + l.l1Entries*entrySize
	if l.l1Entries > 0 {
		l.l1Offset = 3 * clusterSize
		l.clusters += (l.l1Entries*entrySize + clusterSize - 1) / clusterSize
	}
	l.refcountTable = binary.BigEndian.AppendUint64(nil, 2*clusterSize)
	l.refcountBlock = make([]byte, l.clusters*refcountBytes)
	for i := range l.clusters {
		binary.BigEndian.PutUint16(l.refcountBlock[i*refcountBytes:], 1)
	}
	l.cluster0 = l.header(backing, format)
	return l, nil
}

// header returns cluster 0's contents up to the end of the backing file name;
// the rest of the cluster is zero.
func (l *qcow2Layout) header(backing string, format image.Type) []byte {
	be := binary.BigEndian
	h := make([]byte, headerLength)
	be.PutUint32(h[0:], qcowMagic)
	be.PutUint32(h[4:], qcowVersion)
	// backing_file_offset (8) and backing_file_size (16) are set below,
	// once the extensions' length is known.
	be.PutUint32(h[20:], clusterBits)
	be.PutUint64(h[24:], uint64(l.size))
	// crypt_method (32) stays 0: no encryption.
	be.PutUint32(h[36:], uint32(l.l1Entries))
	be.PutUint64(h[40:], uint64(l.l1Offset))
	be.PutUint64(h[48:], 1*clusterSize) // refcount_table_offset
	be.PutUint32(h[56:], 1)             // refcount_table_clusters
	// nb_snapshots (60), snapshots_offset (64): none. incompatible (72),
	// compatible (80) and autoclear (88) features: none, so not dirty,
	// no lazy refcounts, no external data file, no extended L2.
	be.PutUint32(h[96:], refcountOrder)
	be.PutUint32(h[100:], headerLength)
	// compression_type (104) stays 0: zlib, the only type a v3 image may
	// leave unflagged (incompatible bit 3 clear).

	h = appendExtension(h, extBackingFormat, []byte(format))
	names := make([]byte, 0, len(featureNames)*featureEntrySize)
	for _, f := range featureNames {
		var e [featureEntrySize]byte
		e[0], e[1] = f.typ, f.bit
		copy(e[2:], f.name)
		names = append(names, e[:]...)
	}
	h = appendExtension(h, extFeatureNameTab, names)
	h = appendExtension(h, extEnd, nil)

	be.PutUint64(h[8:], uint64(len(h))) // backing_file_offset
	be.PutUint32(h[16:], uint32(len(backing)))
	return append(h, backing...)
}

// appendExtension appends a header extension: type, length, and data padded
// to a multiple of 8 bytes (spec: "padding ... up to the next multiple of 8").
func appendExtension(h []byte, typ uint32, data []byte) []byte {
	h = binary.BigEndian.AppendUint32(h, typ)
	h = binary.BigEndian.AppendUint32(h, uint32(len(data)))
	h = append(h, data...)
	return append(h, make([]byte, (8-len(data)%8)%8)...)
}

// writeOverlay creates path, which must not exist, as an empty qcow2 overlay
// recording backing (stored as given) of the given format and virtual size.
// On error no file is left at path.
func writeOverlay(path, backing string, format image.Type, size int64) (err error) {
	l, err := layoutOverlay(backing, format, size)
	if err != nil {
		return fmt.Errorf("create overlay %s: %w", path, err)
	}
	// O_EXCL: never overwrite, not even through a symlink. 0644 is what
	// qemu-img creates with (before the umask).
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("create overlay: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("create overlay: %w", cerr)
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	// Only the non-zero bytes are written; the truncate supplies the
	// zeros (the rest of the three clusters and the whole L1 table) as a
	// hole, which reads as zeros to QEMU as to anyone. No fsync: qemu-img
	// does none either.
	for _, w := range []struct {
		b   []byte
		off int64
	}{
		{l.cluster0, 0},
		{l.refcountTable, 1 * clusterSize},
		{l.refcountBlock, 2 * clusterSize},
	} {
		if _, err := f.WriteAt(w.b, w.off); err != nil {
			return fmt.Errorf("create overlay: %w", err)
		}
	}
	if err := f.Truncate(l.fileSize); err != nil {
		return fmt.Errorf("create overlay: %w", err)
	}
	return nil
}
