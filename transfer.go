package vmfork

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
)

// A template travels between two vmforks over one byte stream (the SSH
// session of remote.go): the sender sends the chunk manifest; the receiver
// checks it against its host (CheckTemplate, checkHostFacts: the import's
// check) and its name, and answers with a refusal, or with the chunks it
// lacks and, for each, the page hashes of its own chunk at the same place
// in its closest template; the sender sends each of those chunks as the
// pages that differ; the receiver checks every chunk's sha256 on arrival,
// then builds the template's files from its store under staging names and
// renames them into place (installImport): the template appears whole or
// not at all. No chunk travels before the check, and a chunk whose digest
// differs is refused naming it.
//
// Frames: one byte of kind, four of length, the payload.
const (
	frameJSON  = 'J' // a message
	frameError = 'E' // a refusal or failure: transferError, then the stream ends
	frameChunk = 'C' // 32 bytes of digest, then encodeChunk's bitmap and pages
	frameEnd   = 'F' // no more chunks
	frameAlive = 'K' // keepalive while one side works without sending
)

// transferProto is the protocol's version, in the first message.
const transferProto = 1

// maxFrame bounds what one frame may make the reader allocate.
const maxFrame = 64 << 20

// wire is one side of a transfer's stream: framed, counted, and watched
// for silence (idle).
type wire struct {
	r        *bufio.Reader
	w        *bufio.Writer
	mu       sync.Mutex // writers: the work and the keepalive ticker
	in, out  atomic.Int64
	lastRead atomic.Int64 // unix nanoseconds
	peer     string       // names the other side in errors
	// noCompress: this side offers and takes no compression (--no-compress).
	noCompress bool
	// codec is the compression agreed for chunk frames ("" for none).
	codec string
}

func newWire(r io.Reader, w io.Writer, peer string) *wire {
	c := &wire{r: bufio.NewReaderSize(r, 1<<20), w: bufio.NewWriterSize(w, 1<<20), peer: peer}
	c.lastRead.Store(time.Now().UnixNano())
	return c
}

func (c *wire) send(kind byte, payload []byte, flush bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var h [5]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(len(payload)))
	if _, err := c.w.Write(h[:]); err != nil {
		return c.lost(err)
	}
	if _, err := c.w.Write(payload); err != nil {
		return c.lost(err)
	}
	c.out.Add(int64(len(payload) + 5))
	if flush {
		if err := c.w.Flush(); err != nil {
			return c.lost(err)
		}
	}
	return nil
}

func (c *wire) sendJSON(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.send(frameJSON, data, true)
}

// transferError is a refusal or failure sent to the other side: the message
// and the kind of error it wraps, so that exit codes survive the trip.
type transferError struct {
	Error string `json:"error"`
	Kind  string `json:"kind,omitempty"`
}

var errorKinds = map[string]error{"unsupported": ErrUnsupported, "exists": ErrExists, "invalid": ErrInvalid, "not-found": ErrNotFound}

// sendError tells the other side why this side stops; best effort.
func (c *wire) sendError(err error) {
	te := transferError{Error: err.Error()}
	for k, e := range errorKinds {
		if errors.Is(err, e) {
			te.Kind = k
		}
	}
	data, _ := json.Marshal(te)
	_ = c.send(frameError, data, true)
}

// recv returns the next frame that is not a keepalive.
func (c *wire) recv() (byte, []byte, error) {
	for {
		var h [5]byte
		if _, err := io.ReadFull(c.r, h[:]); err != nil {
			return 0, nil, c.lost(err)
		}
		n := binary.BigEndian.Uint32(h[1:])
		if n > maxFrame {
			return 0, nil, fmt.Errorf("%s sent a frame of %d bytes: %w", c.peer, n, ErrInvalid)
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(c.r, payload); err != nil {
			return 0, nil, c.lost(err)
		}
		c.in.Add(int64(n) + 5)
		c.lastRead.Store(time.Now().UnixNano())
		switch h[0] {
		case frameAlive:
			continue
		case frameError:
			var te transferError
			if json.Unmarshal(payload, &te) != nil || te.Error == "" {
				return 0, nil, fmt.Errorf("%s failed: %q", c.peer, payload)
			}
			if e := errorKinds[te.Kind]; e != nil {
				return 0, nil, fmt.Errorf("%s: %s: %w", c.peer, strings.TrimSuffix(te.Error, ": "+e.Error()), e)
			}
			return 0, nil, fmt.Errorf("%s: %s", c.peer, te.Error)
		}
		return h[0], payload, nil
	}
}

func (c *wire) recvJSON(v any) error {
	kind, payload, err := c.recv()
	if err != nil {
		return err
	}
	if kind != frameJSON {
		return fmt.Errorf("%s sent frame %q, want a message: %w", c.peer, kind, ErrInvalid)
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("%s sent a bad message: %w", c.peer, asInvalid(err))
	}
	return nil
}

func (c *wire) lost(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("connection to %s closed: %w", c.peer, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("connection to %s: %w", c.peer, err)
}

// working sends keepalives every interval until the returned func is
// called: the other side's idle watch (watchIdle) then does not take a long
// local step (cutting a 4 GiB template, building its files) for a dead link.
func (c *wire) working(interval time.Duration) (done func()) {
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if c.send(frameAlive, nil, true) != nil {
					return
				}
			}
		}
	}()
	return func() { close(stop) }
}

// watchIdle calls abort once nothing has been read for idle; the returned
// func stops the watch.
func (c *wire) watchIdle(idle time.Duration, abort func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(min(idle/4, time.Second))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if time.Since(time.Unix(0, c.lastRead.Load())) > idle {
					abort()
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// keepaliveEvery is how often a side that works without sending says it is alive.
const keepaliveEvery = 5 * time.Second

// Messages.
type (
	// transferHello opens a session: Op "receive" (the client pushes, the
	// server receives as Name) or "send" (the client pulls Name).
	transferHello struct {
		Proto int    `json:"proto"`
		Op    string `json:"op"`
		Name  string `json:"name"`
	}
	manifestMsg struct {
		Manifest chunkManifest `json:"manifest"`
		// Codecs the sender can compress chunk frames with
		// (transfer_codec.go); an older sender lists none.
		Codecs []string `json:"codecs,omitempty"`
	}
	// wantMsg is the receiver's answer to the manifest: the chunks it
	// lacks, each with its base.
	wantMsg struct {
		Base string `json:"base,omitempty"` // the template diffed against
		// Codec is the one of the manifest's Codecs the chunk frames may
		// be compressed with; none: every frame raw.
		Codec  string      `json:"codec,omitempty"`
		Chunks []chunkWant `json:"chunks"`
	}
	chunkWant struct {
		Digest string `json:"sha256"`
		// Pages are 8 bytes of sha256 per page of the receiver's chunk at
		// the same file and offset; none: diff against zeros.
		Pages []byte `json:"pages,omitempty"`
	}
)

// ReceiveResult is what the receiving host made of a transfer.
type ReceiveResult struct {
	Name       string `json:"name"`
	ID         string `json:"id"`
	Base       string `json:"base,omitempty"`
	Chunks     int    `json:"chunks"`
	ChunksSent int    `json:"chunks_sent"`
	Stored     int64  `json:"stored_bytes"`
	Logical    int64  `json:"logical_bytes"`
	// BuildMS is the part of Elapsed spent writing the template's files
	// from the store once every chunk was there.
	BuildMS float64 `json:"build_ms"`
	Elapsed float64 `json:"elapsed_ms"`
}

// sendTemplate is the sending side: m is the template's manifest. It
// returns what the receiver made of it.
func (mg *Manager) sendTemplate(ctx context.Context, c *wire, m *chunkManifest, progress func(done, total int64)) (*ReceiveResult, error) {
	if err := c.sendJSON(manifestMsg{Manifest: *m, Codecs: c.offeredCodecs()}); err != nil {
		return nil, err
	}
	var want wantMsg
	if err := c.recvJSON(&want); err != nil {
		return nil, err // the receiver's refusal: nothing was sent
	}
	if err := c.agreeCodec(want.Codec); err != nil {
		c.sendError(err)
		return nil, err
	}
	z, err := newChunkEncoder(c.codec)
	if err != nil {
		c.sendError(err)
		return nil, err
	}
	if z != nil {
		defer z.Close()
	}
	return mg.Store.sendChunks(ctx, c, m, &want, z, progress)
}

// sendChunks sends want's chunks of m over c, each as the pages that differ
// from its base (compressed with z where that pays, z nil: none), then the
// end frame, and returns the receiver's answer; a delta archive
// (export_delta.go) is the same frames written to a file, with no answer.
func (s *Store) sendChunks(ctx context.Context, c *wire, m *chunkManifest, want *wantMsg, z *zstd.Encoder, progress func(done, total int64)) (*ReceiveResult, error) {
	at := m.where()
	cs := s.chunkStore()
	var total, done int64
	for _, w := range want.Chunks {
		a, ok := at[w.Digest]
		if !ok {
			err := fmt.Errorf("%s asked for chunk %s, which template %s has not: %w", c.peer, w.Digest, m.Template.ID, ErrInvalid)
			c.sendError(err)
			return nil, err
		}
		total += a.ref.Len
	}
	// Reading and encoding run ahead of the writes to the link, so that
	// the disk, the page comparisons and ssh overlap.
	frames := make(chan encodedChunk, 4)
	stop := make(chan struct{})
	defer close(stop)
	go encodeChunks(cs, want.Chunks, z, frames, stop)
	for e := range frames {
		if err := ctx.Err(); err != nil {
			c.sendError(err)
			return nil, err
		}
		if e.err != nil {
			c.sendError(e.err)
			return nil, e.err
		}
		if err := c.send(e.kind, e.frame, false); err != nil {
			return nil, err
		}
		done += at[e.digest].ref.Len
		if progress != nil {
			progress(done, total)
		}
	}
	if err := c.send(frameEnd, nil, true); err != nil {
		return nil, err
	}
	if c.r == nil {
		return nil, nil // a file: nobody answers
	}
	var res ReceiveResult
	if err := c.recvJSON(&res); err != nil {
		return nil, err
	}
	return &res, nil
}

type encodedChunk struct {
	digest string
	kind   byte // frameChunk or frameChunkZ
	frame  []byte
	err    error
}

// encodeChunks reads and encodes the wanted chunks, in order, into out
// (closed at the end, or after the first error) until stop is closed,
// compressing each with z where that pays (z nil: none). Compressed, it
// runs chunkWorkers chunks at once (zstd is then the sender's bottleneck);
// the frames still leave in the wanted order.
func encodeChunks(cs *chunkStore, want []chunkWant, z *zstd.Encoder, out chan<- encodedChunk, stop <-chan struct{}) {
	defer close(out)
	encode := func(w chunkWant, buf []byte) encodedChunk {
		// Read as stored, not checked again: the receiver checks every
		// chunk against the manifest's digest, and refuses a bad one.
		b, err := readChunkFile(cs.path(w.Digest), buf)
		e := encodedChunk{digest: w.Digest, err: err}
		if err == nil {
			var base []byte
			if len(w.Pages) > 0 {
				base = w.Pages
			}
			e.kind, e.frame = compressFrame(z, encodeChunk(nil, w.Digest, b, base))
		}
		return e
	}
	workers := 1
	if z != nil {
		workers = chunkWorkers
	}
	// Each wanted chunk gets a slot that its worker fills; slots are read
	// in order. A worker never blocks on its slot (buffered), so every
	// chunk handed out is finished even when the sender has given up.
	type job struct {
		w    chunkWant
		slot chan encodedChunk
	}
	jobs, slots := make(chan job), make(chan chan encodedChunk, workers)
	go func() {
		defer close(jobs)
		defer close(slots)
		for _, w := range want {
			j := job{w, make(chan encodedChunk, 1)}
			select {
			case slots <- j.slot:
			case <-stop:
				return
			}
			select {
			case jobs <- j:
			case <-stop:
				j.slot <- encodedChunk{digest: w.Digest, err: errors.New("transfer given up")}
				return
			}
		}
	}()
	for range workers {
		go func() {
			buf := make([]byte, chunkSize)
			for j := range jobs {
				j.slot <- encode(j.w, buf)
			}
		}()
	}
	for slot := range slots {
		e := <-slot
		select {
		case out <- e:
		case <-stop:
			return
		}
		if e.err != nil {
			return
		}
	}
}

// chunkWorkers is how many chunks encodeChunks compresses at once: one
// core compresses text at about 190 MB/s on the 2-core test host
// (BenchmarkCompressFrame), below a fast link's rate.
var chunkWorkers = max(1, min(runtime.NumCPU(), 4))

// readChunkFile reads a stored chunk as it is.
func readChunkFile(path string, buf []byte) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", filepath.Base(path), err)
	}
	defer f.Close()
	n, err := io.ReadFull(f, buf[:cap(buf)])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("chunk %s: %w", filepath.Base(path), err)
	}
	return buf[:n], nil
}

// receiveTemplate is the receiving side: it keeps what c's sender sends as
// template name (the manifest's own name when empty). Every error is also
// sent to the sender.
func (mg *Manager) receiveTemplate(ctx context.Context, c *wire, name string, progress func(done, total int64)) (res *ReceiveResult, err error) {
	defer func() {
		if err != nil {
			c.sendError(err)
		}
	}()
	start := time.Now()
	var msg manifestMsg
	if err := c.recvJSON(&msg); err != nil {
		return nil, err
	}
	m := &msg.Manifest
	if err := m.validate(); err != nil {
		return nil, err
	}
	if name == "" {
		name = m.Template.Name
	}
	if name == "" {
		return nil, fmt.Errorf("template %s has no name: give one: %w", m.Template.ID, ErrInvalid)
	}
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	t := m.Template
	// The import's check, before a chunk travels: the record's paths are
	// the other host's, nothing may be cached there.
	check := t
	check.Paths = TemplatePaths{}
	if err := mg.CheckTemplate(ctx, &check); err != nil {
		return nil, err
	}
	if err := checkHostFacts(&t, m.Host); err != nil {
		return nil, fmt.Errorf("template %s: %w", t.ID, err)
	}
	unlock, err := mg.lockFreeName(ctx, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	cs := mg.Store.chunkStore()
	unlockStore, err := cs.lock(false)
	if err != nil {
		return nil, err
	}
	defer unlockStore()
	alive := c.working(keepaliveEvery) // hashing the base chunks' pages
	want, baseOf, err := mg.Store.wanted(m)
	alive()
	if err != nil {
		return nil, err
	}
	b, err := mg.Store.startBuild(m)
	if err != nil {
		return nil, err
	}
	defer b.abort()
	want.Codec = c.acceptCodec(msg.Codecs)
	c.codec = want.Codec
	if err := c.sendJSON(want); err != nil {
		return nil, err
	}
	if err := mg.Store.receiveChunks(ctx, c, m, want, baseOf, b.write, progress); err != nil {
		return nil, err
	}
	alive = c.working(keepaliveEvery)
	built := time.Now()
	rec, err := mg.Store.finishBuild(ctx, b, m, name)
	alive()
	if err != nil {
		return nil, err
	}
	res = &ReceiveResult{Name: name, ID: rec.ID, Base: want.Base, Chunks: len(m.where()), ChunksSent: len(want.Chunks), Stored: m.stored()}
	for _, f := range m.Files {
		res.Logical += f.Size
	}
	res.BuildMS, res.Elapsed = ms(time.Since(built)), ms(time.Since(start))
	mg.Log.WithFields(map[string]any{"template": rec.ID, "name": name, "peer": c.peer}).Info("template received")
	if err := c.sendJSON(res); err != nil {
		return res, nil // kept here; only the sender's answer is lost
	}
	return res, nil
}

// wanted returns the chunks of m this store lacks, each with the page
// hashes of its base: the chunk at the same file and offset in the local
// template that shares the most chunks with m (baseOf maps a wanted digest
// to the base chunk's digest).
func (s *Store) wanted(m *chunkManifest) (*wantMsg, map[string]string, error) {
	cs := s.chunkStore()
	at := m.where()
	var base *chunkManifest
	var baseID string
	ts, err := s.ListTemplates()
	if err != nil {
		return nil, nil, err
	}
	best := 0
	for _, t := range ts {
		bm := loadChunkMap(t.Paths.Dir)
		if bm == nil {
			continue
		}
		n := 0
		for d := range bm.where() {
			if _, ok := at[d]; ok {
				n++
			}
		}
		if n > best || (n == best && base != nil && t.Created.After(base.Template.Created)) {
			best, base, baseID = n, bm, t.ID
		}
	}
	want, baseOf := s.wantedOver(m, base, baseID, cs.has)
	return want, baseOf, nil
}

// wantedOver returns the chunks of m for which has is false, in file and
// offset order, each with the page hashes of base's chunk at the same file
// and offset (base nil: none, diffed against zeros).
func (s *Store) wantedOver(m *chunkManifest, base *chunkManifest, baseID string, has func(d string) bool) (*wantMsg, map[string]string) {
	cs := s.chunkStore()
	at := m.where()
	baseChunks := map[string]map[int64]string{}
	if base != nil {
		for _, f := range base.Files {
			byOff := map[int64]string{}
			for _, c := range f.Chunks {
				byOff[c.Off] = c.Digest
			}
			baseChunks[f.Name] = byOff
		}
	}
	want := &wantMsg{Base: baseID, Chunks: []chunkWant{}}
	baseOf := map[string]string{}
	buf := make([]byte, chunkSize)
	digests := make([]string, 0, len(at))
	for d := range at {
		digests = append(digests, d)
	}
	// In file and offset order: the sender reads its store in order.
	sort.Slice(digests, func(i, j int) bool {
		a, b := at[digests[i]], at[digests[j]]
		return a.file < b.file || (a.file == b.file && a.ref.Off < b.ref.Off)
	})
	for _, d := range digests {
		if has(d) {
			continue
		}
		w := chunkWant{Digest: d}
		a := at[d]
		if bd := baseChunks[a.file][a.ref.Off]; bd != "" {
			if b, err := cs.read(bd, buf); err == nil && int64(len(b)) == a.ref.Len {
				w.Pages = pageHashes(b)
				baseOf[d] = bd
			}
		}
		want.Chunks = append(want.Chunks, w)
	}
	return want, baseOf
}

// receiveChunks reads the wanted chunks until the end frame, rebuilds each
// over its base, checks its sha256 against the manifest, stores it and
// hands it to got.
func (s *Store) receiveChunks(ctx context.Context, c *wire, m *chunkManifest, want *wantMsg, baseOf map[string]string, got func(d string, b []byte) error, progress func(done, total int64)) error {
	cs := s.chunkStore()
	at := m.where()
	pending := map[string]bool{}
	var total, done int64
	for _, w := range want.Chunks {
		pending[w.Digest] = true
		total += at[w.Digest].ref.Len
	}
	out, bbuf, zbuf := make([]byte, chunkSize), make([]byte, chunkSize), make([]byte, 0, chunkBodyMax)
	dec, err := newChunkDecoder(c.codec)
	if err != nil {
		return err
	}
	if dec != nil {
		defer dec.Close()
	}
	// Frames are read ahead while the last one is checked and written.
	type frameIn struct {
		kind    byte
		payload []byte
		err     error
	}
	in := make(chan frameIn, 4)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(in)
		for {
			kind, payload, err := c.recv()
			select {
			case in <- frameIn{kind, payload, err}:
			case <-stop:
				return
			}
			if err != nil || kind == frameEnd {
				return
			}
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		f, ok := <-in
		if !ok {
			return fmt.Errorf("connection to %s: %w", c.peer, io.ErrUnexpectedEOF)
		}
		kind, payload, err := f.kind, f.payload, f.err
		if err != nil {
			return err
		}
		if kind == frameEnd {
			break
		}
		if (kind != frameChunk && kind != frameChunkZ) || len(payload) < 32 {
			return fmt.Errorf("%s sent frame %q, want a chunk: %w", c.peer, kind, ErrInvalid)
		}
		d := hex.EncodeToString(payload[:32])
		if !pending[d] {
			return fmt.Errorf("%s sent chunk %s, which was not asked for: %w", c.peer, d, ErrInvalid)
		}
		a := at[d]
		var base []byte
		if bd := baseOf[d]; bd != "" {
			if base, err = cs.read(bd, bbuf); err != nil {
				return err
			}
		}
		body, err := frameBody(kind, payload[32:], dec, zbuf)
		var b []byte
		if err == nil {
			b, err = decodeChunk(body, base, int(a.ref.Len), out)
		}
		if err == nil {
			if got := sha256Hex(b); got != d {
				err = fmt.Errorf("sha256 %s", got)
			}
		}
		if err != nil {
			return fmt.Errorf("chunk %s (%s at %d) from %s: %v: corrupted in transit or in the sender's store: refused: %w", d, a.file, a.ref.Off, c.peer, err, ErrInvalid)
		}
		if err := cs.put(d, b); err != nil {
			return err
		}
		if err := got(d, b); err != nil {
			return err
		}
		delete(pending, d)
		done += a.ref.Len
		if progress != nil {
			progress(done, total)
		}
	}
	for d := range pending {
		return fmt.Errorf("%s ended without chunk %s (%d missing): %w", c.peer, d, len(pending), ErrInvalid)
	}
	return nil
}
