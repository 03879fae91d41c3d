package vmfork

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/sharedmem"
)

// An exported template is one file: a zstd-compressed tar stream whose
// first entry, archiveHeader, holds the template's record (manifest,
// spec, lineage), what the exporting host adds to it (HostFacts) and, for
// every file that follows, its size, the extents stored and the sha256 of
// its whole content. Files are stored sparse: holes (SEEK_HOLE) and
// all-zero pages (sharedmem/extents.go) are left out, and come back as holes on import, so a
// guest's untouched RAM costs nothing on either side. The disk is the
// template's whole chain flattened into one standalone qcow2, so the
// archive needs nothing of the exporting host.
//
// zstd is github.com/klauspost/compress/zstd, streaming in both
// directions, so neither side holds a file in memory. Its frames carry a
// checksum of their own (WithEncoderCRC), checked by the decoder, and the
// stream is the one zstd(1) reads and writes: an archive made by an
// earlier vmfork that ran zstd(1) imports unchanged.

// archiveFormat is the version of the archive layout; import refuses others.
const archiveFormat = 1

// Archive entry names.
const (
	archiveHeaderName = "vmfork-template.json"
	archiveFilesDir   = "files/"
)

// Names of the files an archive can hold.
const (
	archRAM      = "ram"
	archDevState = "devstate"
	archDisk     = "disk.qcow2"
	archKernel   = "kernel"
	archInitrd   = "initrd"
	// archDomainXML is FileDomainXML: a libvirt template's children are
	// made from it, so it travels with the template.
	archDomainXML = FileDomainXML
)

// FileDomainXML is the libvirt driver's file in a template's directory: the
// source's migratable domain XML at the freeze, which children copy
// (libvirtdrv.FileSourceXML). Archives and pushes carry it, and an import
// points its kernel and initrd at the imported files, as the record's.
const FileDomainXML = "libvirt-domain.xml"

type archiveHeader struct {
	Format   int           `json:"format"`
	Exported time.Time     `json:"exported"`
	Template Template      `json:"template"`
	Host     HostFacts     `json:"host"`
	Files    []archiveFile `json:"files"`
}

// archiveFile is one stored file: its entry holds the bytes of Extents, in
// order; the rest of its Size reads as zeros.
type archiveFile struct {
	Name    string     `json:"name"`
	Size    int64      `json:"size_bytes"`
	SHA256  string     `json:"sha256"`
	Extents [][2]int64 `json:"extents"`
	file    *os.File   // what it is read from (export)
}

// stored is the bytes the archive holds for all its files: what export
// writes, import reads and both report and count progress against.
func (h *archiveHeader) stored() int64 {
	var n int64
	for _, f := range h.Files {
		n += f.stored()
	}
	return n
}

func (f archiveFile) stored() int64 {
	var n int64
	for _, e := range f.Extents {
		n += e[1]
	}
	return n
}

// ExportRequest asks to write template Name (a kept template's name, or a
// template id) to File.
type ExportRequest struct {
	Name string
	File string
	// Base, when set, makes a delta archive (export_delta.go): only what
	// template Base's chunk map lacks, imported onto a host that keeps Base.
	Base string
	// Progress, when set, is called now and then with the bytes stored so
	// far and in all.
	Progress func(done, total int64)
}

// ExportResult is an export's outcome. Its JSON form is a contract with
// scripts.
type ExportResult struct {
	Name      string  `json:"name,omitempty"`
	ID        string  `json:"id"`
	File      string  `json:"file"`
	Archive   int64   `json:"archive_bytes"`
	Stored    int64   `json:"stored_bytes"`  // data bytes before compression
	Logical   int64   `json:"logical_bytes"` // the files' sizes, holes included
	Elapsed   float64 `json:"elapsed_ms"`
	HasMemory bool    `json:"has_memory"`
	// A delta archive's: the base's name and id here, the template's
	// chunks and how many of them the archive carries.
	Base         string `json:"base,omitempty"`
	BaseID       string `json:"base_id,omitempty"`
	Chunks       int    `json:"chunks,omitempty"`
	ChunksStored int    `json:"chunks_stored,omitempty"`
}

// findTemplate returns the template kept as name, or the template with id
// name.
func (s *Store) findTemplate(name string) (*Template, error) {
	if validateTemplateID(name) == nil {
		return s.LoadTemplate(name)
	}
	return s.FindKept(name)
}

// Export writes a template into one archive file. The file appears whole
// or not at all (a temporary file renamed at the end).
func (mg *Manager) Export(ctx context.Context, req ExportRequest) (*ExportResult, error) {
	start := time.Now()
	if req.File == "" {
		return nil, fmt.Errorf("export %q: no archive file given: %w", req.Name, ErrInvalid)
	}
	if req.Base != "" {
		return mg.exportDelta(ctx, req)
	}
	lockName := req.Name
	if m := templateIDPattern.FindStringSubmatch(req.Name); m != nil {
		lockName = m[1]
	}
	unlock, err := mg.Store.Lock(ctx, lockName)
	if err != nil {
		return nil, fmt.Errorf("export %q: %w", req.Name, err)
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	t, err := mg.Store.findTemplate(req.Name)
	if err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	fail := func(err error) (*ExportResult, error) {
		return nil, fmt.Errorf("export %q: %w", req.Name, err)
	}
	if t.HasMemory {
		// An archive holds one full RAM file (delta.go).
		if err := mg.Store.CompactRAM(ctx, t); err != nil {
			return fail(err)
		}
	}

	hdr := archiveHeader{Format: archiveFormat, Exported: time.Now().UTC(), Template: *t}
	if hdr.Host, err = hostFacts(t); err != nil {
		return fail(err)
	}
	// Beside the templates, under a name no template id can have.
	mg.Store.sweepStaging()
	tmpDir, err := os.MkdirTemp(filepath.Join(mg.Store.StateDir, dirTemplates), stagingPrefix("export"))
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmpDir)
	if hdr.Files, err = openFiles(ctx, t, tmpDir, overlay.Flatten); err != nil {
		return fail(err)
	}
	defer func() {
		for _, f := range hdr.Files {
			f.file.Close()
		}
	}()
	// The files are open and never change: a template rm from here on
	// cannot pull them away, so forks from the template need not wait for
	// the long part.
	unlock()
	locked = false
	for i := range hdr.Files {
		if err := scanFile(ctx, &hdr.Files[i]); err != nil {
			return fail(err)
		}
	}
	out, err := os.CreateTemp(filepath.Dir(req.File), "."+filepath.Base(req.File)+".tmp*")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(out.Name())
	defer out.Close()
	if err := writeArchive(ctx, out, &hdr, req.Progress); err != nil {
		return fail(err)
	}
	if err := out.Sync(); err != nil {
		return fail(err)
	}
	st, err := out.Stat()
	if err != nil {
		return fail(err)
	}
	if err := os.Rename(out.Name(), req.File); err != nil {
		return fail(err)
	}
	res := &ExportResult{Name: t.Name, ID: t.ID, File: req.File, Archive: st.Size(), HasMemory: t.HasMemory, Stored: hdr.stored()}
	for _, f := range hdr.Files {
		res.Logical += f.Size
	}
	res.Elapsed = ms(time.Since(start))
	return res, nil
}

// openFiles opens what template t's archive holds; the disk chains are
// flattened into tmpDir by flatten.
func openFiles(ctx context.Context, t *Template, tmpDir string, flatten func(ctx context.Context, top, path string) error) (files []archiveFile, err error) {
	defer func() {
		if err != nil {
			for _, f := range files {
				f.file.Close()
			}
		}
	}()
	add := func(name, path string) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		files = append(files, archiveFile{Name: name, file: f})
		return nil
	}
	if t.HasMemory {
		if t.Paths.RAM != "" {
			if _, err := os.Stat(t.Paths.RAM); err == nil {
				if err := add(archRAM, t.Paths.RAM); err != nil {
					return files, err
				}
			}
		}
		if t.Paths.DevState != "" {
			if err := add(archDevState, t.Paths.DevState); err != nil {
				return files, err
			}
		}
	}
	if t.Paths.Disk != "" {
		flat := filepath.Join(tmpDir, archDisk)
		if err := flatten(ctx, t.Paths.Disk, flat); err != nil {
			return files, fmt.Errorf("flatten disk: %w", err)
		}
		if err := add(archDisk, flat); err != nil {
			return files, err
		}
	}
	// Each extra disk the template holds an image of, flattened like the
	// boot disk; fresh and keep disks have none, and nothing of a keep
	// disk leaves the host.
	for _, d := range t.Disks {
		if d.File == "" {
			continue
		}
		name := archDiskName(d.ID)
		flat := filepath.Join(tmpDir, name)
		if err := flatten(ctx, d.File, flat); err != nil {
			return files, fmt.Errorf("flatten disk %q: %w", d.ID, err)
		}
		if err := add(name, flat); err != nil {
			return files, err
		}
	}
	if t.HasMemory {
		// Without it a libvirt template's import could not start a child.
		if xml := filepath.Join(t.Paths.Dir, FileDomainXML); fileExists(xml) {
			if err := add(archDomainXML, xml); err != nil {
				return files, err
			}
		}
	}
	if t.Spec.Kernel != "" {
		if err := add(archKernel, t.Spec.Kernel); err != nil {
			return files, err
		}
	}
	if t.Spec.Initrd != "" {
		if err := add(archInitrd, t.Spec.Initrd); err != nil {
			return files, err
		}
	}
	return files, nil
}

// scanFile finds af's data: its data extents (sharedmem.ReadData) less the
// pages in them that are all zeros (sharedmem.NonZeroPages). It hashes the
// whole content, holes read as zeros.
func scanFile(ctx context.Context, af *archiveFile) error {
	f := af.file
	st, err := f.Stat()
	if err != nil {
		return err
	}
	af.Size, af.Extents = st.Size(), [][2]int64{}
	h := sha256.New()
	var hashed int64 // content hashed so far
	addExtent := func(off, n int64) {
		if k := len(af.Extents); k > 0 && af.Extents[k-1][0]+af.Extents[k-1][1] == off {
			af.Extents[k-1][1] += n
			return
		}
		af.Extents = append(af.Extents, [2]int64{off, n})
	}
	err = sharedmem.ReadData(ctx, f, af.Size, func(off int64, p []byte) error {
		hashZerosTo(h, &hashed, off)
		h.Write(p)
		hashed = off + int64(len(p))
		return sharedmem.NonZeroPages(p, func(i int, pg []byte) error {
			addExtent(off+int64(i), int64(len(pg)))
			return nil
		})
	})
	if err != nil {
		return err
	}
	hashZerosTo(h, &hashed, af.Size)
	af.SHA256 = hex.EncodeToString(h.Sum(nil))
	return nil
}

// zstdLevel is zstd(1)'s -3, the level archives were always made with: a
// guest's RAM and a qcow2 compress well at it, faster than the disk writes.
const zstdLevel = zstd.SpeedDefault

// writeArchive writes hdr and its files, compressed, to out.
func writeArchive(ctx context.Context, out io.Writer, hdr *archiveHeader, progress func(done, total int64)) error {
	zw, err := zstd.NewWriter(out, zstd.WithEncoderLevel(zstdLevel), zstd.WithEncoderCRC(true))
	if err != nil {
		return fmt.Errorf("zstd: %w", err)
	}
	werr := writeTar(ctx, zw, hdr, progress)
	// Close writes the last frame's end and checksum; without it the
	// archive reads as truncated.
	if cerr := zw.Close(); werr == nil && cerr != nil {
		werr = fmt.Errorf("zstd: %w", cerr)
	}
	return werr
}

func writeTar(ctx context.Context, w io.Writer, hdr *archiveHeader, progress func(done, total int64)) error {
	tw := tar.NewWriter(w)
	data, err := json.MarshalIndent(hdr, "", "  ")
	if err != nil {
		return err
	}
	mod := hdr.Exported
	if err := tw.WriteHeader(&tar.Header{Name: archiveHeaderName, Mode: 0o600, Size: int64(len(data)), ModTime: mod}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	total, done := hdr.stored(), int64(0)
	last := time.Now()
	for _, f := range hdr.Files {
		if err := tw.WriteHeader(&tar.Header{Name: archiveFilesDir + f.Name, Mode: 0o600, Size: f.stored(), ModTime: mod}); err != nil {
			return err
		}
		src := f.file
		for _, e := range f.Extents {
			if err := ctx.Err(); err != nil {
				return err
			}
			if _, err := io.Copy(tw, io.NewSectionReader(src, e[0], e[1])); err != nil {
				return fmt.Errorf("store %s: %w", f.Name, err)
			}
			done += e[1]
			if progress != nil && time.Since(last) > 500*time.Millisecond {
				progress(done, total)
				last = time.Now()
			}
		}
	}
	if progress != nil {
		progress(done, total)
	}
	return tw.Close()
}
