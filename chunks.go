package vmfork

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/overlay"
)

// A host's chunk store (docs/TEMPLATES.md, "Templates as chunks"): every
// file of a template that travels (RAM, device state, the disk chains
// flattened, kernel, initrd) is cut into fixed chunks of chunkSize bytes,
// each kept once under <state-dir>/chunks/<2 hex>/<sha256>. A template's
// chunk map (chunks.json in its directory) lists, per file, the offset and
// digest of every chunk that is not all zeros; holes and zero chunks are
// not in it and come back as holes. Templates made from one base share
// most chunks, so a push or pull (transfer.go) sends only the chunks the
// other host lacks, and of those only the pages that differ from the
// receiver's chunk at the same place (its closest template's).
//
// The store is on the state dir's disk, beside the templates' own files:
// a template's RAM is then kept twice on a host that sent or received it
// (in the mem dir to be mapped, in the store to be sent or diffed
// against). Chunks no template's map names go at gc (collectChunks).

// chunkSize is a huge page and a multiple of every qcow2 cluster size.
const chunkSize = 2 << 20

// chunkPage is the unit a chunk is diffed in: a guest page.
const chunkPage = 4096

// chunkFormat is the version of the chunk manifest; a receiver refuses others.
const chunkFormat = 1

const (
	dirChunks      = "chunks"
	fileChunkMap   = "chunks.json"
	chunkLockFile  = ".lock"
	chunkTmpPrefix = ".tmp-"
)

// chunkManifest is what a push or pull sends first: the template's record,
// the facts of the host it was made on, and every file's chunk map.
type chunkManifest struct {
	Format    int           `json:"format"`
	ChunkSize int64         `json:"chunk_size"`
	Template  Template      `json:"template"`
	Host      HostFacts     `json:"host"`
	Files     []chunkedFile `json:"files"`
	cutMS     float64       // what cutting took, when this process did
}

type chunkedFile struct {
	Name   string     `json:"name"`
	Size   int64      `json:"size_bytes"`
	Chunks []chunkRef `json:"chunks"`
}

// chunkRef is one chunk of a file: Len is chunkSize but for a file's last.
type chunkRef struct {
	Off    int64  `json:"off"`
	Len    int64  `json:"len"`
	Digest string `json:"sha256"`
}

// stored is the bytes the manifest's chunks hold, every occurrence counted.
func (m *chunkManifest) stored() (n int64) {
	for _, f := range m.Files {
		for _, c := range f.Chunks {
			n += c.Len
		}
	}
	return n
}

// where returns, for every digest, the first file and chunk that has it.
func (m *chunkManifest) where() map[string]chunkAt {
	at := map[string]chunkAt{}
	for _, f := range m.Files {
		for _, c := range f.Chunks {
			if _, ok := at[c.Digest]; !ok {
				at[c.Digest] = chunkAt{file: f.Name, ref: c}
			}
		}
	}
	return at
}

type chunkAt struct {
	file string
	ref  chunkRef
}

// validate refuses a manifest a receiver cannot trust: an unknown format,
// file or digest, chunks out of order or range.
func (m *chunkManifest) validate() error {
	if m.Format != chunkFormat || m.ChunkSize != chunkSize {
		return fmt.Errorf("chunk manifest format %d with %d-byte chunks, this vmfork reads %d with %d: %w", m.Format, m.ChunkSize, chunkFormat, chunkSize, ErrUnsupported)
	}
	if err := ValidateName(m.Template.Source); err != nil {
		return fmt.Errorf("chunk manifest: source: %w", err)
	}
	seen := map[string]bool{}
	for _, f := range m.Files {
		switch f.Name {
		case archRAM, archDevState, archDisk, archKernel, archInitrd, archDomainXML:
		default:
			if !m.Template.hasDiskFile(f.Name) {
				return fmt.Errorf("chunk manifest: unknown file %q: %w", f.Name, ErrInvalid)
			}
		}
		if seen[f.Name] || f.Size < 0 {
			return fmt.Errorf("chunk manifest: file %q twice or of negative size: %w", f.Name, ErrInvalid)
		}
		seen[f.Name] = true
		next := int64(0)
		for _, c := range f.Chunks {
			if !validDigest(c.Digest) {
				return fmt.Errorf("chunk manifest: file %q: chunk digest %q is not a sha256: %w", f.Name, c.Digest, ErrInvalid)
			}
			if c.Off < next || c.Off%chunkSize != 0 || c.Len <= 0 || c.Len != min(chunkSize, f.Size-c.Off) {
				return fmt.Errorf("chunk manifest: file %q: chunk at %d (%d bytes) out of order or range: %w", f.Name, c.Off, c.Len, ErrInvalid)
			}
			next = c.Off + c.Len
		}
	}
	if m.Template.HasMemory && !seen[archDevState] {
		return fmt.Errorf("chunk manifest: a template with memory and no device state: %w", ErrInvalid)
	}
	return nil
}

func validDigest(d string) bool {
	if len(d) != 64 {
		return false
	}
	_, err := hex.DecodeString(d)
	return err == nil && strings.ToLower(d) == d
}

// chunkStore is one host's store of chunks, each a file named by its sha256.
type chunkStore struct{ dir string }

func (s *Store) chunkStore() *chunkStore {
	return &chunkStore{dir: filepath.Join(s.StateDir, dirChunks)}
}

func (c *chunkStore) path(d string) string { return filepath.Join(c.dir, d[:2], d) }

func (c *chunkStore) has(d string) bool {
	_, err := os.Stat(c.path(d))
	return err == nil
}

// read returns chunk d's bytes, checked against its digest: a chunk damaged
// on this host's disk is removed (a later transfer fetches it again) and
// refused, never used.
func (c *chunkStore) read(d string, buf []byte) ([]byte, error) {
	f, err := os.Open(c.path(d))
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", d, err)
	}
	defer f.Close()
	n, err := io.ReadFull(f, buf[:cap(buf)])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("chunk %s: %w", d, err)
	}
	b := buf[:n]
	if got := sha256Hex(b); got != d {
		os.Remove(c.path(d))
		return nil, fmt.Errorf("chunk %s in this host's store has sha256 %s: removed: %w", d, got, ErrInvalid)
	}
	return b, nil
}

// put stores b as chunk d, once: a temporary file renamed into place, so a
// reader never sees half a chunk. The caller has checked b's digest.
func (c *chunkStore) put(d string, b []byte) error {
	if c.has(d) {
		return nil
	}
	dir := filepath.Dir(c.path(d))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("chunk store: %w", err)
	}
	f, err := os.CreateTemp(dir, chunkTmpPrefix+fmt.Sprint(os.Getpid())+"-*")
	if err != nil {
		return fmt.Errorf("chunk store: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("chunk %s: %w", d, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("chunk %s: %w", d, err)
	}
	return os.Rename(f.Name(), c.path(d))
}

// lock takes the store's lock: shared for a transfer (its chunks are not
// named by a template yet), exclusive for collectChunks, which skips its
// turn rather than wait while a transfer runs.
func (c *chunkStore) lock(exclusive bool) (unlock func(), err error) {
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return nil, fmt.Errorf("chunk store: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(c.dir, chunkLockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("chunk store: %w", err)
	}
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX | unix.LOCK_NB
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("chunk store lock: %w", err)
	}
	return func() { f.Close() }, nil
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// loadChunkMap reads template t's chunk map; nil if it has none or one of
// another format.
func loadChunkMap(dir string) *chunkManifest {
	var m chunkManifest
	if readJSON(filepath.Join(dir, fileChunkMap), &m) != nil || m.Format != chunkFormat || m.ChunkSize != chunkSize {
		return nil
	}
	return &m
}

// chunkTemplate returns template t's chunk manifest, cutting its files into
// the store the first time (or when a chunk its map names is gone). It is
// called with t's lock held; unlock is called once t's files are open,
// since they never change, as Export does.
func (s *Store) chunkTemplate(ctx context.Context, t *Template, unlock func()) (*chunkManifest, error) {
	cs := s.chunkStore()
	if m := loadChunkMap(t.Paths.Dir); m != nil {
		complete := true
		for d := range m.where() {
			if !cs.has(d) {
				complete = false
				break
			}
		}
		if complete {
			unlock()
			m.Template = *t
			return m, nil
		}
	}
	start := time.Now()
	m := &chunkManifest{Format: chunkFormat, ChunkSize: chunkSize, Template: *t}
	var err error
	if m.Host, err = hostFacts(t); err != nil {
		unlock()
		return nil, err
	}
	s.sweepStaging()
	tmpDir, err := os.MkdirTemp(filepath.Join(s.StateDir, dirTemplates), stagingPrefix("export"))
	if err != nil {
		unlock()
		return nil, err
	}
	defer os.RemoveAll(tmpDir)
	files, err := openFiles(ctx, t, tmpDir, overlay.FlattenAligned)
	unlock()
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, f := range files {
			f.file.Close()
		}
	}()
	buf := make([]byte, chunkSize)
	for _, af := range files {
		cf, err := cs.cut(ctx, af.file, af.Name, buf)
		if err != nil {
			return nil, fmt.Errorf("chunk %s: %w", af.Name, err)
		}
		m.Files = append(m.Files, *cf)
	}
	if err := writeJSON(filepath.Join(t.Paths.Dir, fileChunkMap), m); err != nil {
		return nil, err
	}
	m.cutMS = ms(time.Since(start))
	return m, nil
}

// cut cuts f into the store and returns its chunk map. Chunks that are
// holes are skipped with SEEK_DATA; all-zero ones are read and left out.
func (c *chunkStore) cut(ctx context.Context, f *os.File, name string, buf []byte) (*chunkedFile, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	cf := &chunkedFile{Name: name, Size: st.Size(), Chunks: []chunkRef{}}
	for off := int64(0); off < cf.Size; off += chunkSize {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // holes to the end
		}
		if err == nil && data >= off+chunkSize {
			off = data/chunkSize*chunkSize - chunkSize
			continue
		}
		n := min(chunkSize, cf.Size-off)
		b := buf[:n]
		if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		if allZero(b) {
			continue
		}
		d := sha256Hex(b)
		if err := c.put(d, b); err != nil {
			return nil, err
		}
		cf.Chunks = append(cf.Chunks, chunkRef{Off: off, Len: n, Digest: d})
	}
	return cf, nil
}

var zeroChunk = make([]byte, chunkSize)

func allZero(b []byte) bool { return bytes.Equal(b, zeroChunk[:len(b)]) }

// collectChunks removes the chunks no template's map names, and what a
// killed transfer left half-written. It skips its turn while a transfer
// holds the store. It returns how many chunks it removed.
func (s *Store) collectChunks() (int, error) {
	cs := s.chunkStore()
	if _, err := os.Stat(cs.dir); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	unlock, err := cs.lock(true)
	if err != nil {
		return 0, nil // a transfer runs: next time
	}
	defer unlock()
	ts, err := s.ListTemplates()
	if err != nil {
		return 0, err
	}
	needed := map[string]bool{}
	for _, t := range ts {
		if m := loadChunkMap(t.Paths.Dir); m != nil {
			for d := range m.where() {
				needed[d] = true
			}
		}
	}
	subs, err := os.ReadDir(cs.dir)
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, sub := range subs {
		if !sub.IsDir() {
			continue
		}
		dir := filepath.Join(cs.dir, sub.Name())
		es, _ := os.ReadDir(dir)
		for _, e := range es {
			if needed[e.Name()] {
				continue
			}
			// Under the exclusive lock no transfer writes: a temporary
			// file is a killed one's.
			if os.Remove(filepath.Join(dir, e.Name())) == nil && validDigest(e.Name()) {
				removed++
			}
		}
		os.Remove(dir) // when empty
	}
	return removed, nil
}

// pageHashes returns 8 bytes of sha256 for each page of b: what a receiver
// tells a sender of its base chunk, so that only the pages that differ
// travel. A collision (2^-64 per page) sends too little; the chunk's full
// digest, checked on arrival, refuses it.
func pageHashes(b []byte) []byte {
	out := make([]byte, 0, (len(b)+chunkPage-1)/chunkPage*8)
	for i := 0; i < len(b); i += chunkPage {
		h := sha256.Sum256(b[i:min(i+chunkPage, len(b))])
		out = append(out, h[:8]...)
	}
	return out
}

// encodeChunk writes chunk b as a frame payload: its digest, a bitmap of the
// pages that follow, and those pages, the ones that differ from the base
// the receiver named (base page hashes, or zeros when base is nil).
func encodeChunk(dst []byte, digest string, b, base []byte) []byte {
	raw, _ := hex.DecodeString(digest)
	dst = append(dst[:0], raw...)
	pages := (len(b) + chunkPage - 1) / chunkPage
	bm := len(dst)
	dst = append(dst, make([]byte, (pages+7)/8)...)
	for p := 0; p < pages; p++ {
		pg := b[p*chunkPage : min((p+1)*chunkPage, len(b))]
		var same bool
		if base == nil {
			same = allZero(pg)
		} else if len(base) >= (p+1)*8 {
			h := sha256.Sum256(pg)
			same = bytes.Equal(h[:8], base[p*8:(p+1)*8])
		}
		if !same {
			dst[bm+p/8] |= 1 << (p % 8)
			dst = append(dst, pg...)
		}
	}
	return dst
}

// decodeChunk rebuilds a chunk of n bytes from payload (encodeChunk's,
// digest already taken off) over base (nil: zeros) into out.
func decodeChunk(payload, base []byte, n int, out []byte) ([]byte, error) {
	pages := (n + chunkPage - 1) / chunkPage
	bml := (pages + 7) / 8
	if len(payload) < bml {
		return nil, errors.New("frame shorter than its page bitmap")
	}
	bm, data := payload[:bml], payload[bml:]
	out = out[:n]
	if base != nil && len(base) == n {
		copy(out, base)
	} else {
		clear(out)
	}
	for p := 0; p < pages; p++ {
		if bm[p/8]&(1<<(p%8)) == 0 {
			continue
		}
		pg := out[p*chunkPage : min((p+1)*chunkPage, n)]
		if len(data) < len(pg) {
			return nil, errors.New("frame shorter than its pages")
		}
		copy(pg, data[:len(pg)])
		data = data[len(pg):]
	}
	if len(data) != 0 {
		return nil, errors.New("frame longer than its pages")
	}
	return out, nil
}
