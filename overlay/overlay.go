package overlay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	qcow2reader "github.com/lima-vm/go-qcow2reader"
	"github.com/lima-vm/go-qcow2reader/image"
	"github.com/lima-vm/go-qcow2reader/image/qcow2"
	"golang.org/x/sys/unix"
)

// qemuImg is the qemu-img binary to run: $VMFORK_QEMU_IMG, or qemu-img on
// the PATH (tests point the variable at a stub). Only Rebase still runs it;
// overlays are written in Go (qcow2create.go).
func qemuImg() string {
	if p := os.Getenv("VMFORK_QEMU_IMG"); p != "" {
		return p
	}
	return "qemu-img"
}

// Create makes a qcow2 overlay at path on top of backing, as `qemu-img create
// -f qcow2 -b backing -F FORMAT path` would: backing is recorded as given,
// with its format (read from its header, not guessed: QEMU 7.2 refuses an
// overlay without one) and its virtual size. A relative backing is taken
// relative to path's directory, which is how QEMU will resolve it. path must
// not exist.
func Create(ctx context.Context, backing, path string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("create overlay %s: %w", path, err)
	}
	resolved := backing
	if !filepath.IsAbs(backing) {
		resolved = filepath.Join(filepath.Dir(path), backing)
	}
	format, size, err := probe(resolved)
	if err != nil {
		return fmt.Errorf("create overlay %s: %w", path, err)
	}
	return writeOverlay(path, backing, format, size)
}

// CreateOn makes a qcow2 overlay at path whose backing file is recorded as
// backing, without opening backing: it may not exist yet, or be held by a
// running QEMU. A fork uses this to prepare a running machine's next top
// layer before it pauses the machine. size is the virtual size in bytes,
// rounded up to 512 as qemu-img does. path must not exist.
func CreateOn(ctx context.Context, backing string, format image.Type, size int64, path string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("create overlay %s: %w", path, err)
	}
	return writeOverlay(path, backing, format, size)
}

// Rebase makes top stop reading through the layers between it and
// newBacking: their data is copied into top (qemu-img's safe mode) and top's
// backing becomes newBacking, or nothing when newBacking is empty. The image
// must not be in use.
func Rebase(ctx context.Context, top, newBacking string) error {
	args := []string{"rebase", "-q", "-f", "qcow2", "-b", newBacking}
	if newBacking != "" {
		format, err := Format(newBacking)
		if err != nil {
			return err
		}
		args = append(args, "-F", string(format))
	}
	return run(ctx, qemuImg(), append(args, top)...)
}

// Format returns the image format of path ("qcow2", "raw", ...).
func Format(path string) (image.Type, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("image format: %w", err)
	}
	defer f.Close()
	img, err := qcow2reader.Open(f)
	if err != nil {
		return "", fmt.Errorf("image format of %s: %w", path, err)
	}
	defer img.Close()
	return img.Type(), nil
}

// Layer is one image in a backing chain.
type Layer struct {
	Path   string     `json:"path"`
	Format image.Type `json:"format"`
	// VirtualSize is the guest-visible size in bytes.
	VirtualSize int64 `json:"virtual_size_bytes"`
	// AllocatedBytes is what the file takes on the host file system.
	AllocatedBytes int64 `json:"allocated_bytes"`
}

// maxChain bounds a chain walk so a loop of backing files cannot hang us.
const maxChain = 64

// Chain returns the layers from path (the top) down to the base image.
func Chain(path string) ([]Layer, error) {
	var chain []Layer
	for p := path; p != ""; {
		if len(chain) == maxChain {
			return nil, fmt.Errorf("backing chain of %s is longer than %d", path, maxChain)
		}
		l, backing, err := inspect(p)
		if err != nil {
			return nil, err
		}
		chain = append(chain, l)
		p = backing
	}
	return chain, nil
}

func inspect(path string) (Layer, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return Layer{}, "", fmt.Errorf("inspect image: %w", err)
	}
	defer f.Close()
	alloc, err := AllocatedBytes(path)
	if err != nil {
		return Layer{}, "", err
	}
	format, size, backing, err := header(f)
	if err != nil {
		return Layer{}, "", fmt.Errorf("inspect %s: %w", path, err)
	}
	return Layer{Path: path, Format: format, VirtualSize: size, AllocatedBytes: alloc}, backing, nil
}

// probe returns the format and virtual size of the image at path, for an
// overlay on it. Like qemu-img create, it does not open path's own backing
// file.
func probe(path string) (image.Type, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("backing image: %w", err)
	}
	defer f.Close()
	format, size, _, err := header(f)
	if err != nil {
		return "", 0, fmt.Errorf("backing image %s: %w", path, err)
	}
	return format, size, nil
}

// header reads an image's format, virtual size and, for qcow2, the full path
// of its backing file.
func header(f *os.File) (image.Type, int64, string, error) {
	// Open the qcow2 header alone: Chain walks the backing chain itself,
	// one file at a time, so that each layer's own size is reported, and
	// an overlay needs only its backing's own header.
	q, err := qcow2.Open(f, skipBacking)
	if errors.Is(err, image.ErrWrongType) {
		img, err := qcow2reader.Open(f)
		if err != nil {
			return "", 0, "", err
		}
		defer img.Close()
		size := img.Size()
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeDevice != 0 && img.Type() == "raw" {
			// A raw block device: go-qcow2reader takes stat's 0.
			if size, err = deviceSize(f); err != nil {
				return "", 0, "", err
			}
		}
		return img.Type(), size, "", nil
	}
	if err != nil {
		return "", 0, "", err
	}
	defer q.Close()
	return q.Type(), q.Size(), q.BackingFileFullPath, nil
}

// skipBacking stands in for go-qcow2reader's backing-file opener: Chain
// walks the chain itself, so a layer's backing image is only closed here.
func skipBacking(ra io.ReaderAt, t image.Type) (image.Image, error) {
	if c, ok := ra.(io.Closer); ok {
		c.Close()
	}
	return unreadable{t}, nil
}

// unreadable is a backing image that is never read.
type unreadable struct{ t image.Type }

func (u unreadable) ReadAt([]byte, int64) (int, error)         { return 0, u.Readable() }
func (u unreadable) Close() error                              { return nil }
func (u unreadable) Extent(int64, int64) (image.Extent, error) { return image.Extent{}, u.Readable() }
func (u unreadable) Type() image.Type                          { return u.t }
func (u unreadable) Size() int64                               { return -1 }
func (u unreadable) Readable() error                           { return errors.New("backing image not opened") }

// AllocatedBytes is the space path takes on its file system.
func AllocatedBytes(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("allocated size of %s: %w", path, err)
	}
	return st.Blocks * 512, nil
}

// run runs a short-lived command and returns an error with its argv and a
// trimmed stderr when it fails.
func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("failed to run %v: stderr=%q: %w", cmd.Args, strings.TrimSpace(stderr.String()), err)
	}
	return nil
}

// InUse reports whether a process holds QEMU's image locks on path: QEMU
// takes open-file-description locks on bytes 100-299 of every image it has
// open (file-posix "locking"). A machine believed stopped whose disk is in
// use is not stopped, and its disk must not be moved.
func InUse(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("check image locks: %w", err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 100, Len: 200}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false, fmt.Errorf("check image locks on %s: %w", path, err)
	}
	return lk.Type != unix.F_UNLCK, nil
}

// CreateEmpty makes an empty qcow2 image of size bytes at path, with no
// backing file: a fork child's fresh disk. path must not exist.
func CreateEmpty(ctx context.Context, size int64, path string) error {
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("create image %s: %w", path, fs.ErrExist)
	}
	return run(ctx, qemuImg(), "create", "-q", "-f", "qcow2", path, strconv.FormatInt(size, 10))
}
