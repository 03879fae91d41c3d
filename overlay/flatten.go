package overlay

import "context"

// Flatten writes the whole chain under top into one standalone qcow2 image
// at path, with no backing file: only the clusters some layer holds are
// written, so the image is as small as the data. top is opened read-only
// with force-share: it is a frozen layer, never written, that running
// children read as their backing. path must not exist.
func Flatten(ctx context.Context, top, path string) error {
	format, err := Format(top)
	if err != nil {
		return err
	}
	return run(ctx, qemuImg(), "convert", "-U", "-q", "-f", string(format), "-O", "qcow2", top, path)
}

// FlattenAligned is Flatten with the image's metadata preallocated
// (preallocation=metadata): every guest cluster gets a fixed place in the
// file, in guest order, and clusters no layer holds stay holes. Two
// flattenings of chains that differ in a few clusters then differ in those
// clusters' bytes only, at the same offsets, which is what a chunked,
// delta transfer (chunks.go) needs; Flatten packs the clusters, so one
// cluster allocated in the middle moves every later one.
func FlattenAligned(ctx context.Context, top, path string) error {
	format, err := Format(top)
	if err != nil {
		return err
	}
	return run(ctx, qemuImg(), "convert", "-U", "-q", "-f", string(format), "-O", "qcow2", "-o", "preallocation=metadata", top, path)
}
