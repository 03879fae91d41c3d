package vmfork

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestChunkCodec(t *testing.T) {
	b := make([]byte, chunkSize-100) // a file's last chunk: not a whole page at its end
	copy(b[5*chunkPage:], "page five")
	copy(b[len(b)-10:], "last bytes")
	d := sha256Hex(b)
	// Against zeros: only the two non-zero pages travel.
	frame := encodeChunk(nil, d, b, nil)
	pages := (len(b) + chunkPage - 1) / chunkPage
	if want := 32 + (pages+7)/8 + chunkPage + (len(b) - (pages-1)*chunkPage); len(frame) != want {
		t.Fatalf("frame of 2 non-zero pages is %d bytes, want %d", len(frame), want)
	}
	got, err := decodeChunk(frame[32:], nil, len(b), make([]byte, chunkSize))
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("decode against zeros: %v, equal %v", err, bytes.Equal(got, b))
	}
	// Against a base that differs in one page: only that page travels.
	base := bytes.Clone(b)
	base[100*chunkPage+7] ^= 1
	frame = encodeChunk(frame, d, b, pageHashes(base))
	if want := 32 + (pages+7)/8 + chunkPage; len(frame) != want {
		t.Fatalf("frame of 1 differing page is %d bytes, want %d", len(frame), want)
	}
	got, err = decodeChunk(frame[32:], base, len(b), make([]byte, chunkSize))
	if err != nil || sha256Hex(got) != d {
		t.Fatalf("decode against a base: %v", err)
	}
	// A frame cut short, or with bytes to spare, is refused.
	if _, err := decodeChunk(frame[32:len(frame)-1], base, len(b), make([]byte, chunkSize)); err == nil {
		t.Error("a short frame decoded")
	}
	if _, err := decodeChunk(append(bytes.Clone(frame[32:]), 0), base, len(b), make([]byte, chunkSize)); err == nil {
		t.Error("a long frame decoded")
	}
}

func TestChunkCutAndCollect(t *testing.T) {
	s := newTestStore(t)
	cs := s.chunkStore()
	f, err := os.Create(filepath.Join(t.TempDir(), "file"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Chunk 0 a hole, chunk 1 data, chunk 2 written zeros, chunk 3 (short) data.
	size := int64(3*chunkSize + 1000)
	f.Truncate(size)
	f.WriteAt([]byte("one"), chunkSize+10)
	f.WriteAt(make([]byte, chunkSize), 2*chunkSize)
	f.WriteAt([]byte("three"), 3*chunkSize+900)
	cf, err := cs.cut(t.Context(), f, archRAM, make([]byte, chunkSize))
	if err != nil {
		t.Fatal(err)
	}
	if len(cf.Chunks) != 2 || cf.Chunks[0].Off != chunkSize || cf.Chunks[1].Off != 3*chunkSize || cf.Chunks[1].Len != 1000 {
		t.Fatalf("chunk map %+v, want chunks 1 and 3 (1000 bytes) only", cf.Chunks)
	}
	for _, c := range cf.Chunks {
		b, err := cs.read(c.Digest, make([]byte, chunkSize))
		if err != nil || int64(len(b)) != c.Len {
			t.Fatalf("chunk %s: %v", c.Digest, err)
		}
	}
	m := &chunkManifest{Format: chunkFormat, ChunkSize: chunkSize, Template: Template{Source: "web"}, Files: []chunkedFile{*cf}}
	if err := m.validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	for name, edit := range map[string]func(m *chunkManifest){
		"a digest that is not one": func(m *chunkManifest) { m.Files[0].Chunks[0].Digest = "../../etc" },
		"chunks out of order":      func(m *chunkManifest) { m.Files[0].Chunks[0].Off = 3 * chunkSize },
		"a chunk off its grid":     func(m *chunkManifest) { m.Files[0].Chunks[0].Off++ },
		"an unknown file":          func(m *chunkManifest) { m.Files[0].Name = "../x" },
		"another chunk size":       func(m *chunkManifest) { m.ChunkSize = 1 << 20 },
	} {
		bad := *m
		bad.Files = []chunkedFile{{Name: cf.Name, Size: cf.Size, Chunks: append([]chunkRef(nil), cf.Chunks...)}}
		edit(&bad)
		if err := bad.validate(); err == nil {
			t.Errorf("a manifest with %s validated", name)
		}
	}
	// A chunk damaged on disk is refused and removed, never returned.
	p := cs.path(cf.Chunks[0].Digest)
	data, _ := os.ReadFile(p)
	data[10] ^= 1
	os.WriteFile(p, data, 0o600)
	if _, err := cs.read(cf.Chunks[0].Digest, make([]byte, chunkSize)); err == nil || cs.has(cf.Chunks[0].Digest) {
		t.Errorf("a damaged chunk read: %v, still there %v", err, cs.has(cf.Chunks[0].Digest))
	}
	// No template names the other chunk: gc takes it.
	if n, err := s.collectChunks(); err != nil || n != 1 || cs.has(cf.Chunks[1].Digest) {
		t.Errorf("collectChunks = %d, %v; want the one unnamed chunk gone", n, err)
	}
}

func TestParseRemote(t *testing.T) {
	for _, c := range []struct {
		in, dest, name string
		needName, ok   bool
	}{
		{"host2", "host2", "", false, true},
		{"root@host2:golden", "root@host2", "golden", true, true},
		{"10.0.0.2:golden-v2", "10.0.0.2", "golden-v2", true, true},
		{"[fd00::2]:golden", "fd00::2", "golden", true, true},
		{"host2", "", "", true, false},
		{"host2:", "", "", false, false},
		{"-oProxyCommand=x", "", "", false, false},
		{"host2:Bad_Name", "", "", false, false},
		{"a b:golden", "", "", false, false},
	} {
		r, err := ParseRemote(c.in, c.needName)
		if (err == nil) != c.ok || (c.ok && (r.Dest != c.dest || r.Name != c.name)) {
			t.Errorf("ParseRemote(%q) = %+v, %v", c.in, r, err)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRemote(%q): %v is not ErrInvalid", c.in, err)
		}
	}
}

// transferPair runs a transfer of template name from mg's store to to's
// over pipes, as push and pull do over SSH; it returns both sides' errors.
func transferPair(t *testing.T, from, to *Manager, name, as string, edit ...func(*chunkManifest)) (*ReceiveResult, error, error) {
	t.Helper()
	ar, bw := io.Pipe()
	br, aw := io.Pipe()
	sender, receiver := newWire(ar, aw, "receiver"), newWire(br, bw, "sender")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var recvErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, recvErr = to.receiveTemplate(ctx, receiver, as, nil)
		bw.Close()
	}()
	m, err := from.chunked(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range edit {
		e(m)
	}
	res, sendErr := from.sendTemplate(ctx, sender, m, nil)
	aw.Close()
	<-done
	return res, sendErr, recvErr
}

func TestTransferLoopback(t *testing.T) {
	from, _ := newTestManager(t)
	tpl := keptFake(t, from)

	// Another QEMU: refused before any chunk, naming the field.
	other := NewManager(newTestStore(t), &hostDriver{&linkDriver{fakeDriver: newFakeDriver()}, "9.0.0"}, nil)
	_, sendErr, recvErr := transferPair(t, from, other, "golden", "")
	if sendErr == nil || !strings.Contains(sendErr.Error(), `QEMU version "7.2.0", this host has "9.0.0"`) || !errors.Is(sendErr, ErrUnsupported) || recvErr == nil {
		t.Fatalf("transfer to a host with QEMU 9.0.0: sender %v, receiver %v", sendErr, recvErr)
	}
	if got, _ := filepath.Glob(filepath.Join(other.Store.StateDir, dirChunks, "*", "*")); len(got) != 0 {
		t.Error("chunks arrived before the check")
	}

	to := NewManager(newTestStore(t), &hostDriver{&linkDriver{fakeDriver: newFakeDriver()}, "7.2.0"}, nil)
	// A guest that saw a CPU flag this host lacks (-cpu host): refused
	// before any chunk, naming the flag.
	_, sendErr, recvErr = transferPair(t, from, to, "golden", "", func(m *chunkManifest) {
		m.Template.Spec.CPUModel = hostCPUModel
		m.Host.CPUFlags = []string{"no-such-flag"}
	})
	if sendErr == nil || !strings.Contains(sendErr.Error(), `CPU flags "no-such-flag"`) || recvErr == nil {
		t.Fatalf("transfer to a host without a flag: sender %v, receiver %v", sendErr, recvErr)
	}
	if got, _ := filepath.Glob(filepath.Join(to.Store.StateDir, dirChunks, "*", "*")); len(got) != 0 {
		t.Error("chunks arrived before the CPU flag check")
	}
	// A byte flipped in the sender's store: refused naming the chunk.
	m, err := from.chunked(t.Context(), "golden")
	if err != nil {
		t.Fatal(err)
	}
	var victim string
	for _, f := range m.Files {
		if f.Name == archRAM {
			victim = f.Chunks[0].Digest
		}
	}
	p := from.Store.chunkStore().path(victim)
	good, _ := os.ReadFile(p)
	bad := bytes.Clone(good)
	bad[4096] ^= 0x80
	os.WriteFile(p, bad, 0o600)
	_, sendErr, recvErr = transferPair(t, from, to, "golden", "copy")
	if recvErr == nil || !strings.Contains(recvErr.Error(), "chunk "+victim) || sendErr == nil {
		t.Fatalf("transfer of a corrupted chunk: receiver %v, sender %v", recvErr, sendErr)
	}
	if to.Store.chunkStore().has(victim) {
		t.Error("the corrupted chunk was stored")
	}
	if _, err := to.Store.FindKept("copy"); err == nil {
		t.Error("the refused transfer left a template")
	}
	os.WriteFile(p, good, 0o600)

	res, sendErr, recvErr := transferPair(t, from, to, "golden", "copy")
	if sendErr != nil || recvErr != nil {
		t.Fatalf("transfer: sender %v, receiver %v", sendErr, recvErr)
	}
	got, err := to.Store.FindKept("copy")
	if err != nil || got.ID != res.ID || !got.HasMemory {
		t.Fatalf("received template %+v (%v), result %+v", got, err, res)
	}
	want, _ := os.ReadFile(tpl.Paths.RAM)
	have, _ := os.ReadFile(got.Paths.RAM)
	if !bytes.Equal(want, have) {
		t.Error("the received RAM file differs from the sent one")
	}
	// The name is taken: refused before any chunk.
	if _, sendErr, _ = transferPair(t, from, to, "golden", "copy"); !errors.Is(sendErr, ErrExists) {
		t.Errorf("transfer onto a taken name: %v, want ErrExists", sendErr)
	}
	// A second copy: every chunk is there already, none travels.
	res, sendErr, recvErr = transferPair(t, from, to, "golden", "copy2")
	if sendErr != nil || recvErr != nil || res.ChunksSent != 0 || res.Base == "" {
		t.Fatalf("second transfer: %+v, sender %v, receiver %v; want no chunk sent", res, sendErr, recvErr)
	}
}

// A link that goes silent (an ssh whose other end hangs) is given up after
// the idle timeout, not waited on forever.
func TestTransferIdleTimeout(t *testing.T) {
	mg, _ := newTestManager(t)
	keptFake(t, mg)
	hang := filepath.Join(t.TempDir(), "ssh")
	if err := os.WriteFile(hang, []byte("#!/bin/sh\nexec sleep 60\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := mg.Push(t.Context(), TransferRequest{Name: "golden", Remote: Remote{Dest: "host2"}, SSH: hang, Idle: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "host2 sent nothing for 300ms: gave up") {
		t.Fatalf("push over a silent link: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the silent link was given up after %v", d)
	}
	// The serving side gives up too.
	r, w := io.Pipe()
	defer w.Close()
	aborted := make(chan struct{})
	go mg.Serve(t.Context(), r, io.Discard, 200*time.Millisecond, func() { close(aborted); r.Close() })
	select {
	case <-aborted:
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not give up a silent session")
	}
}

// cutWriter passes n bytes on, then fails and closes the pipe: a link that
// dies mid-transfer.
type cutWriter struct {
	w *io.PipeWriter
	n int
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if len(p) > c.n {
		c.w.Write(p[:c.n])
		c.n = 0
		c.w.Close()
		return 0, errors.New("link cut")
	}
	c.n -= len(p)
	return c.w.Write(p)
}

// A link that dies after the manifest and part of the chunks leaves no
// template and no staging file on the receiver.
func TestTransferLinkCut(t *testing.T) {
	from, _ := newTestManager(t)
	keptFake(t, from)
	to := NewManager(newTestStore(t), &hostDriver{&linkDriver{fakeDriver: newFakeDriver()}, "7.2.0"}, nil)
	m, err := from.chunked(t.Context(), "golden")
	if err != nil {
		t.Fatal(err)
	}
	manifest, _ := json.Marshal(manifestMsg{Manifest: *m})
	ar, bw := io.Pipe()
	br, aw := io.Pipe()
	// The manifest's frame and half of the first chunk's.
	sender := newWire(ar, &cutWriter{w: aw, n: len(manifest) + 5 + 2048}, "receiver")
	// Raw chunks: the cut's place is counted in raw bytes.
	sender.noCompress = true
	receiver := newWire(br, bw, "sender")
	done := make(chan error, 1)
	go func() {
		_, err := to.receiveTemplate(t.Context(), receiver, "copy", nil)
		bw.Close()
		done <- err
	}()
	if _, err := from.sendTemplate(t.Context(), sender, m, nil); err == nil {
		t.Error("the sender went on over a cut link")
	}
	ar.Close()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("receiver over a cut link: %v", err)
	}
	if _, err := to.Store.FindKept("copy"); err == nil {
		t.Error("a cut transfer left a template")
	}
	left, _ := filepath.Glob(filepath.Join(to.Store.StateDir, dirTemplates, "*"))
	mem, _ := filepath.Glob(filepath.Join(to.Store.MemDir, "*"))
	if len(left)+len(mem) != 0 {
		t.Errorf("a cut transfer left %v %v", left, mem)
	}
}
