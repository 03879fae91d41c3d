package vmfork

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/overlay"
)

// maxArchiveHeader bounds the header entry read into memory.
const maxArchiveHeader = 16 << 20

// ImportRequest asks to import the template archive File (export.go),
// kept under As, or under the name it was exported with.
type ImportRequest struct {
	File string
	As   string
	// Progress, when set, is called now and then with the bytes stored so
	// far and in all.
	Progress func(done, total int64)
}

// ImportResult is an import's outcome. Its JSON form is a contract with
// scripts.
type ImportResult struct {
	Name      string  `json:"name"`
	ID        string  `json:"id"`
	Source    string  `json:"source"`
	HasMemory bool    `json:"has_memory"`
	Files     int     `json:"files"`
	Stored    int64   `json:"stored_bytes"`
	Elapsed   float64 `json:"elapsed_ms"`
	// Base is the template a delta archive was rebuilt over.
	Base string `json:"base,omitempty"`
}

// Import reads a template archive into this host's store as a kept
// template. The manifest is checked against this host and driver before any
// file is written; every file's sha256 is checked as it is written. The
// files land in temporary names under the state and mem dirs and are
// renamed into place only once all of them are complete and correct, so a
// refused, corrupted or truncated archive leaves nothing behind.
func (mg *Manager) Import(ctx context.Context, req ImportRequest) (*ImportResult, error) {
	start := time.Now()
	in, err := os.Open(req.File)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", req.File, asInvalid(err))
	}
	defer in.Close()
	fail := func(err error) (*ImportResult, error) {
		return nil, fmt.Errorf("import %s: %w", req.File, err)
	}
	// The decoder's window is bounded, so a crafted frame header cannot
	// make it allocate more than that; it decodes as the stream is read.
	br := bufio.NewReaderSize(in, 1<<20)
	if isDeltaArchive(br) {
		return mg.importDelta(ctx, req, br)
	}
	zr, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(zstdMaxWindow), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return fail(fmt.Errorf("zstd: %w", err))
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	hdr, err := readArchiveHeader(tr)
	if err != nil {
		return fail(err)
	}
	name := req.As
	if name == "" {
		name = hdr.Template.Name
	}
	if name == "" {
		return fail(fmt.Errorf("the archive's template %s has no name: give one with --as: %w", hdr.Template.ID, ErrInvalid))
	}
	if err := ValidateName(name); err != nil {
		return fail(err)
	}
	t := hdr.Template
	// The record's directory is the exporting host's: nothing may be
	// cached there.
	check := t
	check.Paths = TemplatePaths{}
	if err := mg.CheckTemplate(ctx, &check); err != nil {
		return fail(err)
	}
	if err := checkHostFacts(&t, hdr.Host); err != nil {
		return fail(fmt.Errorf("template %s: %w", t.ID, err))
	}
	unlock, err := mg.lockFreeName(ctx, name)
	if err != nil {
		return fail(err)
	}
	defer unlock()
	st, err := mg.Store.extractArchive(ctx, tr, hdr, req.Progress)
	if err != nil {
		return fail(err)
	}
	defer st.remove()
	// Drain the stream to its end: zstd's own check of the last frame
	// (its checksum, a truncation) only runs when it reaches it.
	if _, err := io.Copy(io.Discard, zr); err != nil {
		return fail(fmt.Errorf("archive is corrupted or truncated: %w", asInvalid(err)))
	}
	rec, err := mg.Store.installImport(&t, name, st)
	if err != nil {
		return fail(err)
	}
	mg.Log.WithFields(map[string]any{"template": rec.ID, "name": name}).Info("template imported")
	return &ImportResult{Name: name, ID: rec.ID, Source: rec.Source, HasMemory: rec.HasMemory, Files: len(hdr.Files), Stored: hdr.stored(), Elapsed: ms(time.Since(start))}, nil
}

// zstdMaxWindow bounds the decoder's memory: what zstd(1) allows without
// --long (128 MiB), far above the 2 MiB window of the level archives are
// written at.
const zstdMaxWindow = 128 << 20

// readArchiveHeader reads and validates the archive's first entry.
func readArchiveHeader(tr *tar.Reader) (*archiveHeader, error) {
	th, err := tr.Next()
	if err != nil {
		return nil, fmt.Errorf("archive is corrupted or truncated: no header: %w", asInvalid(err))
	}
	if th.Name != archiveHeaderName || th.Size > maxArchiveHeader {
		return nil, fmt.Errorf("not a vmfork template archive: first entry %q: %w", th.Name, ErrInvalid)
	}
	data, err := io.ReadAll(tr)
	if err != nil {
		return nil, fmt.Errorf("archive is corrupted or truncated: header: %w", asInvalid(err))
	}
	var hdr archiveHeader
	if err := json.Unmarshal(data, &hdr); err != nil {
		return nil, fmt.Errorf("archive header: %w", asInvalid(err))
	}
	if hdr.Format != archiveFormat {
		return nil, fmt.Errorf("archive format %d, this vmfork reads %d: %w", hdr.Format, archiveFormat, ErrUnsupported)
	}
	if err := ValidateName(hdr.Template.Source); err != nil {
		return nil, fmt.Errorf("archive header: source: %w", err)
	}
	seen := map[string]bool{}
	for _, f := range hdr.Files {
		switch f.Name {
		case archRAM, archDevState, archDisk, archKernel, archInitrd, archDomainXML:
		default:
			if hdr.Template.hasDiskFile(f.Name) {
				break
			}
			return nil, fmt.Errorf("archive header: unknown file %q: %w", f.Name, ErrInvalid)
		}
		if seen[f.Name] {
			return nil, fmt.Errorf("archive header: file %q twice: %w", f.Name, ErrInvalid)
		}
		seen[f.Name] = true
		end := int64(0)
		for _, e := range f.Extents {
			if e[0] < end || e[1] <= 0 || e[0]+e[1] > f.Size || e[0]+e[1] < e[0] {
				return nil, fmt.Errorf("archive header: file %q: extent %v out of order or range: %w", f.Name, e, ErrInvalid)
			}
			end = e[0] + e[1]
		}
	}
	if hdr.Template.HasMemory && !seen[archDevState] {
		return nil, fmt.Errorf("archive header: a template with memory and no device state: %w", ErrInvalid)
	}
	return &hdr, nil
}

// staged are an import's files under temporary names.
type staged struct {
	dir   string          // under <state-dir>/templates, named .import-*
	ram   string          // in the mem dir, named .import-*.ram.tmp
	files map[string]bool // names received
}

func (st *staged) remove() {
	if st.dir != "" {
		os.RemoveAll(st.dir)
	}
	if st.ram != "" {
		os.Remove(st.ram)
	}
}

// extractArchive writes every file the header lists, checking its size and
// sha256. On error nothing of it is left.
func (s *Store) extractArchive(ctx context.Context, tr *tar.Reader, hdr *archiveHeader, progress func(done, total int64)) (_ *staged, err error) {
	st := &staged{files: map[string]bool{}}
	defer func() {
		if err != nil {
			st.remove()
		}
	}()
	// Names no template id or machine can have, so nothing else reads them
	// and a crash leaves nothing that looks like a template.
	s.sweepStaging()
	if st.dir, err = os.MkdirTemp(filepath.Join(s.StateDir, dirTemplates), stagingPrefix("import")); err != nil {
		return nil, err
	}
	want := map[string]archiveFile{}
	for _, f := range hdr.Files {
		want[f.Name] = f
	}
	total, done := hdr.stored(), int64(0)
	for {
		th, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("archive is corrupted or truncated: %w", asInvalid(err))
		}
		name, ok := strings.CutPrefix(th.Name, archiveFilesDir)
		f, listed := want[name]
		if !ok || !listed || st.files[name] || th.Size != f.stored() {
			return nil, fmt.Errorf("archive entry %q is not in its header (or twice, or of another size): %w", th.Name, ErrInvalid)
		}
		var out *os.File
		if name == archRAM {
			out, err = os.CreateTemp(s.MemDir, stagingPrefix("import")+"*"+ramSuffix+".tmp")
			if err == nil {
				st.ram = out.Name()
			}
		} else {
			out, err = os.OpenFile(filepath.Join(st.dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		}
		if err != nil {
			return nil, err
		}
		err = extractFile(ctx, tr, out, f, func(n int64) {
			done += n
			if progress != nil {
				progress(done, total)
			}
		})
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("archive file %s: %w", name, err)
		}
		st.files[name] = true
	}
	for name := range want {
		if !st.files[name] {
			return nil, fmt.Errorf("archive is truncated: file %s is missing: %w", name, ErrInvalid)
		}
	}
	return st, nil
}

// extractFile writes f's extents from r into out, leaves the rest holes,
// and checks the content's sha256.
func extractFile(ctx context.Context, r io.Reader, out *os.File, f archiveFile, step func(int64)) error {
	if err := out.Truncate(f.Size); err != nil {
		return err
	}
	h := sha256.New()
	var hashed int64
	for _, e := range f.Extents {
		if err := ctx.Err(); err != nil {
			return err
		}
		hashZerosTo(h, &hashed, e[0])
		w := io.MultiWriter(io.NewOffsetWriter(out, e[0]), h)
		if _, err := io.CopyN(w, r, e[1]); err != nil {
			return fmt.Errorf("archive is corrupted or truncated: %w", asInvalid(err))
		}
		hashed = e[0] + e[1]
		step(e[1])
	}
	hashZerosTo(h, &hashed, f.Size)
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return fmt.Errorf("sha256 %s, the archive's header says %s: the archive is corrupted: %w", got, f.SHA256, ErrInvalid)
	}
	return nil
}

var zeroBlock = make([]byte, 1<<20)

func hashZerosTo(h hash.Hash, hashed *int64, to int64) {
	for *hashed < to {
		n := min(int64(len(zeroBlock)), to-*hashed)
		h.Write(zeroBlock[:n])
		*hashed += n
	}
}

// installImport moves staged files into a new template kept as name, with
// the record's paths rewritten to this store, and writes the record last.
// t is the archive's record.
func (s *Store) installImport(t *Template, name string, st *staged) (_ *Template, err error) {
	for name := range st.files {
		if name != archDisk && !t.hasDiskFile(name) {
			continue
		}
		// Flattened at export: a standalone image whose chain names no
		// file of the exporting host.
		chain, err := overlay.Chain(filepath.Join(st.dir, name))
		if err != nil {
			return nil, err
		}
		if len(chain) != 1 {
			return nil, fmt.Errorf("archive disk %s has a backing file %s: %w", name, chain[1].Path, ErrInvalid)
		}
	}
	nt, err := s.NewTemplate(t.Source)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.RemoveTemplate(nt.ID)
		}
	}()
	// The reserved directory is empty: rename(2) replaces it in one step
	// (os.Rename refuses an existing directory).
	if err := unix.Rename(st.dir, nt.Paths.Dir); err != nil {
		return nil, fmt.Errorf("template %q: %w", nt.ID, err)
	}
	st.dir = ""
	if st.ram != "" {
		if err := os.Rename(st.ram, nt.Paths.RAM); err != nil {
			return nil, fmt.Errorf("template %q: %w", nt.ID, err)
		}
		st.ram = ""
	}
	rec := *t
	rec.ID, rec.Name, rec.Paths = nt.ID, name, nt.Paths
	rec.PoolSize, rec.Expires, rec.ForeignDisk = 0, time.Time{}, false
	// The lineage names machines and templates of the other host.
	rec.SourceParent, rec.SourceTemplate = "", ""
	// A root here: the other host's family ledger did not travel with it,
	// so its children must not share a family id with machines there (nor
	// with another import of the same archive).
	rec.Family = newFamily()
	if !st.files[archRAM] {
		rec.Paths.RAM = ""
	}
	if !st.files[archDevState] {
		rec.Paths.DevState = ""
		rec.HasMemory = false
	}
	if st.files[archDisk] {
		rec.Spec.Disk = rec.Paths.Disk
	} else {
		rec.Paths.Disk, rec.Spec.Disk = "", ""
	}
	if err := importedDisks(&rec, st.files); err != nil {
		return nil, err
	}
	// The kernel and initrd travel with the template; the device list names
	// them by path, so it follows.
	rec.Manifest.Devices = append([]string(nil), t.Manifest.Devices...)
	var domainXML []byte // the libvirt driver's, its paths rewritten as the record's
	if st.files[archDomainXML] {
		if domainXML, err = os.ReadFile(filepath.Join(rec.Paths.Dir, archDomainXML)); err != nil {
			return nil, err
		}
	}
	rewrite := func(flag, old, file string) {
		if old == "" || !st.files[file] {
			return
		}
		p := filepath.Join(rec.Paths.Dir, file)
		// The embedded driver's device line is "-kernel PATH"; the
		// libvirt driver's "kernel PATH initrd PATH cmdline ...", and its
		// domain XML names each in an element of its own.
		word := strings.TrimPrefix(flag, "-")
		for i, d := range rec.Manifest.Devices {
			switch {
			case d == flag+" "+old:
				rec.Manifest.Devices[i] = flag + " " + p
			case strings.HasPrefix(d, "kernel "):
				rec.Manifest.Devices[i] = strings.Replace(d, word+" "+old+" ", word+" "+p+" ", 1)
			}
		}
		if domainXML != nil {
			domainXML = bytes.ReplaceAll(domainXML, []byte("<"+word+">"+xmlText(old)+"</"+word+">"), []byte("<"+word+">"+xmlText(p)+"</"+word+">"))
		}
		if flag == "-kernel" {
			rec.Spec.Kernel = p
		} else {
			rec.Spec.Initrd = p
		}
	}
	rewrite("-kernel", t.Spec.Kernel, archKernel)
	rewrite("-initrd", t.Spec.Initrd, archInitrd)
	if domainXML != nil {
		if err := os.WriteFile(filepath.Join(rec.Paths.Dir, archDomainXML), domainXML, 0o600); err != nil {
			return nil, err
		}
	}
	if err := s.WriteTemplate(&rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// stagingPrefix starts the names of an export's or import's temporary files
// in the state and mem dirs: "."+what+"-<pid>-". No template id or machine
// name starts with a dot, and the pid tells whose they are.
func stagingPrefix(what string) string {
	return fmt.Sprintf(".%s-%d-", what, os.Getpid())
}

// sweepStaging removes what an export or import killed midway left: the
// temporary files of processes that are gone.
func (s *Store) sweepStaging() {
	for _, pattern := range []string{
		filepath.Join(s.StateDir, dirTemplates, ".import-*"),
		filepath.Join(s.StateDir, dirTemplates, ".export-*"),
		filepath.Join(s.MemDir, ".import-*"),
	} {
		found, _ := filepath.Glob(pattern)
		for _, p := range found {
			var what string
			var pid int
			base := strings.ReplaceAll(filepath.Base(p), "-", " ")
			if n, _ := fmt.Sscanf(base, ".%s %d", &what, &pid); n != 2 || pid <= 0 {
				continue
			}
			if unix.Kill(pid, 0) == nil || errors.Is(unix.Kill(pid, 0), unix.EPERM) {
				continue // its process still runs
			}
			os.RemoveAll(p)
		}
	}
}

// lockFreeName takes name's lock for a template arriving under it (import,
// a delta archive, a push's receiver) and checks, under the lock, that no
// machine and no kept template has the name. The caller unlocks.
func (mg *Manager) lockFreeName(ctx context.Context, name string) (func(), error) {
	unlock, err := mg.Store.Lock(ctx, name)
	if err != nil {
		return nil, err
	}
	if _, err := mg.Store.LoadMachine(name); err == nil {
		unlock()
		return nil, fmt.Errorf("a machine is named %q: %w", name, ErrExists)
	}
	if k, err := mg.Store.FindKept(name); err == nil {
		unlock()
		return nil, fmt.Errorf("template %s is kept as %q: %w", k.ID, name, ErrExists)
	}
	return unlock, nil
}

// xmlText is s escaped as XML character data.
func xmlText(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

// fileExists reports whether path names something.
func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
