package vmfork

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// A delta archive (`template export NAME --base OLD FILE`) is a push
// session recorded in a file (transfer.go): the frames the sender would
// send to a receiver that holds OLD and nothing else, answered from OLD's
// chunk map instead of a live receiver. It holds the manifest of NAME, the
// chunks of NAME that OLD's map lacks and, of each, only the pages that
// differ from OLD's chunk at the same file and offset (encodeChunk,
// compressed per frame as on the wire). Import onto a host that keeps OLD
// with the same chunk map rebuilds NAME as a pull would: each chunk over
// its base, its sha256 checked against the manifest, the files built under
// staging names and installed in one step (finishBuild).
//
// Layout: the line "VMFORK-DELTA 1 <sha256 of the header frame's
// payload>\n", then frames as on the wire: one message (deltaHeader), the
// chunk frames in the order of its Want, and the end frame. The line's
// digest covers the header (the manifest, with every chunk's digest); each
// chunk is covered by its digest, so a flipped byte anywhere is refused,
// and a truncated file lacks chunks or the end frame.
//
// OLD's identity is the sha256 of its chunk map (the files' chunk lists):
// a template that merely shares OLD's name is refused, as is an OLD whose
// files were cut differently (one that came by a full archive, whose disk
// was flattened in another layout: push or pull it instead).

const deltaMagic = "VMFORK-DELTA "

// deltaFormat is the delta archive's version; import refuses others.
const deltaFormat = 1

// deltaHeader is a delta archive's first frame.
type deltaHeader struct {
	Format   int       `json:"format"`
	Exported time.Time `json:"exported"`
	Base     deltaBase `json:"base"`
	manifestMsg
	Want wantMsg `json:"want"`
	// BaseOf maps a wanted chunk to OLD's chunk it is diffed against (the
	// one at the same file and offset); a chunk not in it is diffed
	// against zeros.
	BaseOf map[string]string `json:"base_of,omitempty"`
}

// deltaBase names the template a delta archive was made against.
type deltaBase struct {
	Name string `json:"name"`
	ID   string `json:"id"` // on the exporting host: ids differ between hosts
	// MapSHA256 is chunkMapDigest of its chunk map: its identity.
	MapSHA256 string `json:"chunk_map_sha256"`
}

// chunkMapDigest is a template's identity across hosts: the sha256 of its
// files' chunk lists. Two hosts that hold a template with the same digest
// hold the same bytes.
func chunkMapDigest(m *chunkManifest) string {
	data, _ := json.Marshal(m.Files)
	return sha256Hex(data)
}

// exportDelta writes template req.Name as a delta archive against req.Base.
func (mg *Manager) exportDelta(ctx context.Context, req ExportRequest) (*ExportResult, error) {
	start := time.Now()
	fail := func(err error) (*ExportResult, error) {
		return nil, fmt.Errorf("export %q --base %q: %w", req.Name, req.Base, err)
	}
	if req.Base == req.Name {
		return fail(fmt.Errorf("the base is the template itself: name the template it was made after: %w", ErrInvalid))
	}
	if _, err := os.Lstat(req.File); err == nil {
		return fail(fmt.Errorf("%s exists: a delta archive is not written over a file: %w", req.File, ErrExists))
	}
	if err := checkLocalName(req.Base); err != nil {
		return fail(err)
	}
	if _, err := mg.Store.findTemplate(req.Base); err != nil {
		return fail(fmt.Errorf("base: %w", err))
	}
	m, err := mg.chunked(ctx, req.Name)
	if err != nil {
		return fail(err)
	}
	bm, err := mg.chunked(ctx, req.Base)
	if err != nil {
		return fail(fmt.Errorf("base: %w", err))
	}
	if bm.Template.Name == "" {
		return fail(fmt.Errorf("base %s is kept under no name, and the importing host finds its base by name: %w", bm.Template.ID, ErrInvalid))
	}
	if m.Template.ID == bm.Template.ID {
		return fail(fmt.Errorf("the base is the template itself (%s): %w", m.Template.ID, ErrInvalid))
	}
	inBase := bm.where()
	want, baseOf := mg.Store.wantedOver(m, bm, bm.Template.ID, func(d string) bool { _, ok := inBase[d]; return ok })
	want.Codec = codecZstd
	hdr := deltaHeader{
		Format: deltaFormat, Exported: time.Now().UTC(),
		Base:        deltaBase{Name: bm.Template.Name, ID: bm.Template.ID, MapSHA256: chunkMapDigest(bm)},
		manifestMsg: manifestMsg{Manifest: *m, Codecs: []string{codecZstd}},
		Want:        *want, BaseOf: baseOf,
	}
	// The file carries no page hashes: the importer diffs against its own
	// copy of the base chunks, which BaseOf names.
	// (A copy: the frames are encoded against want's page hashes.)
	hdr.Want.Chunks = make([]chunkWant, len(want.Chunks))
	for i, w := range want.Chunks {
		hdr.Want.Chunks[i] = chunkWant{Digest: w.Digest}
	}
	data, err := json.Marshal(hdr)
	if err != nil {
		return fail(err)
	}
	out, err := os.CreateTemp(filepath.Dir(req.File), "."+filepath.Base(req.File)+".tmp*")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(out.Name())
	defer out.Close()
	if _, err := fmt.Fprintf(out, "%s%d %s\n", deltaMagic, deltaFormat, sha256Hex(data)); err != nil {
		return fail(err)
	}
	c := &wire{w: bufio.NewWriterSize(out, 1<<20), peer: "archive " + req.File, codec: codecZstd}
	if err := c.send(frameJSON, data, false); err != nil {
		return fail(err)
	}
	z, err := newChunkEncoder(codecZstd)
	if err != nil {
		return fail(err)
	}
	defer z.Close()
	unlockStore, err := mg.Store.chunkStore().lock(false)
	if err != nil {
		return fail(err)
	}
	defer unlockStore()
	if _, err := mg.Store.sendChunks(ctx, c, m, want, z, req.Progress); err != nil {
		return fail(err)
	}
	if err := out.Sync(); err != nil {
		return fail(err)
	}
	st, err := out.Stat()
	if err != nil {
		return fail(err)
	}
	if err := os.Link(out.Name(), req.File); err != nil { // never over a file made meanwhile
		return fail(err)
	}
	res := &ExportResult{Name: m.Template.Name, ID: m.Template.ID, File: req.File, Archive: st.Size(), HasMemory: m.Template.HasMemory,
		Base: hdr.Base.Name, BaseID: hdr.Base.ID, Chunks: len(m.where()), ChunksStored: len(want.Chunks)}
	for _, f := range m.Files {
		res.Logical += f.Size
	}
	for _, w := range want.Chunks {
		res.Stored += m.where()[w.Digest].ref.Len
	}
	res.Elapsed = ms(time.Since(start))
	return res, nil
}

// isDeltaArchive reports whether r (at its start) is a delta archive; a
// full archive starts with zstd's magic.
func isDeltaArchive(r *bufio.Reader) bool {
	b, _ := r.Peek(len(deltaMagic))
	return string(b) == deltaMagic
}

// readDeltaHeader reads and checks a delta archive's line and header.
func readDeltaHeader(c *wire) (*deltaHeader, error) {
	line, err := c.r.ReadString('\n')
	if err != nil || len(line) > 200 {
		return nil, fmt.Errorf("delta archive is corrupted or truncated: no header line: %w", ErrInvalid)
	}
	var format int
	var sum string
	if _, err := fmt.Sscanf(line, deltaMagic+"%d %s\n", &format, &sum); err != nil {
		return nil, fmt.Errorf("delta archive header line %q: %w", line, ErrInvalid)
	}
	if format != deltaFormat {
		return nil, fmt.Errorf("delta archive format %d, this vmfork reads %d: %w", format, deltaFormat, ErrUnsupported)
	}
	kind, data, err := c.recv()
	if err != nil {
		return nil, truncated(err)
	}
	if kind != frameJSON {
		return nil, fmt.Errorf("delta archive: frame %q where its header goes: %w", kind, ErrInvalid)
	}
	if got := sha256Hex(data); got != sum {
		return nil, fmt.Errorf("delta archive header has sha256 %s, its first line says %s: corrupted: %w", got, sum, ErrInvalid)
	}
	var hdr deltaHeader
	if err := json.Unmarshal(data, &hdr); err != nil {
		return nil, fmt.Errorf("delta archive header: %w", asInvalid(err))
	}
	if err := hdr.Manifest.validate(); err != nil {
		return nil, err
	}
	if err := ValidateName(hdr.Base.Name); err != nil {
		return nil, fmt.Errorf("delta archive base: %w", err)
	}
	at := hdr.Manifest.where()
	for _, w := range hdr.Want.Chunks {
		if _, ok := at[w.Digest]; !ok {
			return nil, fmt.Errorf("delta archive: chunk %s is not the template's: %w", w.Digest, ErrInvalid)
		}
	}
	return &hdr, nil
}

// truncated says what a stream that ended early is, in a file.
func truncated(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("delta archive is truncated: %w", ErrInvalid)
	}
	return err
}

// importDelta is Import for a delta archive, read from r.
func (mg *Manager) importDelta(ctx context.Context, req ImportRequest, r *bufio.Reader) (*ImportResult, error) {
	start := time.Now()
	fail := func(err error) (*ImportResult, error) {
		return nil, fmt.Errorf("import %s: %w", req.File, err)
	}
	c := &wire{r: r, w: bufio.NewWriter(io.Discard), peer: "archive " + req.File}
	hdr, err := readDeltaHeader(c)
	if err != nil {
		return fail(err)
	}
	m := &hdr.Manifest
	name := req.As
	if name == "" {
		name = m.Template.Name
	}
	if name == "" {
		return fail(fmt.Errorf("the archive's template %s has no name: give one with --as: %w", m.Template.ID, ErrInvalid))
	}
	if err := ValidateName(name); err != nil {
		return fail(err)
	}
	// The base first: without it nothing here can be rebuilt.
	old, err := mg.Store.FindKept(hdr.Base.Name)
	if err != nil {
		return fail(fmt.Errorf("a delta against template %q (chunk map sha256 %.12s), which this host does not keep: import or pull %q first: %w",
			hdr.Base.Name, hdr.Base.MapSHA256, hdr.Base.Name, ErrNotFound))
	}
	t := m.Template
	check := t
	check.Paths = TemplatePaths{}
	if err := mg.CheckTemplate(ctx, &check); err != nil {
		return fail(err)
	}
	if err := checkHostFacts(&t, m.Host); err != nil {
		return fail(fmt.Errorf("template %s: %w", t.ID, err))
	}
	bm, err := mg.chunked(ctx, old.ID)
	if err != nil {
		return fail(fmt.Errorf("base %q: %w", hdr.Base.Name, err))
	}
	if got := chunkMapDigest(bm); got != hdr.Base.MapSHA256 {
		return fail(fmt.Errorf("a delta against template %q with chunk map sha256 %.12s; the %q kept here (%s) has %.12s: another template of that name: %w",
			hdr.Base.Name, hdr.Base.MapSHA256, hdr.Base.Name, old.ID, got, ErrInvalid))
	}
	unlock, err := mg.lockFreeName(ctx, name)
	if err != nil {
		return fail(err)
	}
	defer unlock()
	cs := mg.Store.chunkStore()
	unlockStore, err := cs.lock(false)
	if err != nil {
		return fail(err)
	}
	defer unlockStore()
	// Every chunk the archive does not carry, and every base it names,
	// must be here: the base's (checked again as they are read).
	inBase := bm.where()
	carried := map[string]bool{}
	for _, w := range hdr.Want.Chunks {
		carried[w.Digest] = true
	}
	for d := range m.where() {
		if _, ok := inBase[d]; !ok && !carried[d] {
			return fail(fmt.Errorf("delta archive: chunk %s is neither in it nor in template %q: %w", d, hdr.Base.Name, ErrInvalid))
		}
	}
	for d, bd := range hdr.BaseOf {
		if _, ok := inBase[bd]; !ok || !carried[d] {
			return fail(fmt.Errorf("delta archive: chunk %s diffed against %s, not a chunk of template %q: %w", d, bd, hdr.Base.Name, ErrInvalid))
		}
	}
	b, err := mg.Store.startBuild(m)
	if err != nil {
		return fail(err)
	}
	defer b.abort()
	if c.codec = hdr.Want.Codec; c.codec != "" && c.codec != codecZstd {
		return fail(fmt.Errorf("delta archive compressed as %q: %w", c.codec, ErrUnsupported))
	}
	if err := mg.Store.receiveChunks(ctx, c, m, &hdr.Want, hdr.BaseOf, b.write, req.Progress); err != nil {
		return fail(truncated(err))
	}
	if rest, _ := r.Peek(1); len(rest) != 0 {
		return fail(fmt.Errorf("delta archive has bytes after its end: %w", ErrInvalid))
	}
	rec, err := mg.Store.finishBuild(ctx, b, m, name)
	if err != nil {
		return fail(err)
	}
	mg.Log.WithFields(map[string]any{"template": rec.ID, "name": name, "base": old.ID}).Info("template imported from a delta")
	res := &ImportResult{Name: name, ID: rec.ID, Source: rec.Source, HasMemory: rec.HasMemory, Files: len(m.Files), Base: hdr.Base.Name,
		Elapsed: ms(time.Since(start))}
	at := m.where()
	for _, w := range hdr.Want.Chunks {
		res.Stored += at[w.Digest].ref.Len
	}
	return res, nil
}
