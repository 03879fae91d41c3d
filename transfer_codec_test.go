package vmfork

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

// compressiblePair is a sender with a kept template whose RAM compresses
// (text), and one that does not (random bytes), and an empty receiver.
func compressiblePair(t *testing.T) (from, to *Manager, tpl *Template) {
	from, _ = newTestManager(t)
	tpl = keptFake(t, from)
	f, err := os.OpenFile(tpl.Paths.RAM, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	text := bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog 0123456789\n"), 4<<20/55)
	f.WriteAt(text, 0)
	noise := make([]byte, 2<<20)
	rand.Read(noise)
	f.WriteAt(noise, 4<<20)
	f.Close()
	to = NewManager(newTestStore(t), &hostDriver{&linkDriver{fakeDriver: newFakeDriver()}, "7.2.0"}, nil)
	return from, to, tpl
}

// codecPair is transferPair with each side's willingness to compress set,
// returning the bytes the sender wrote and the codec agreed.
func codecPair(t *testing.T, from, to *Manager, as string, senderRaw, receiverRaw bool) (res *ReceiveResult, out int64, codec string) {
	t.Helper()
	ar, bw := io.Pipe()
	br, aw := io.Pipe()
	sender, receiver := newWire(ar, aw, "receiver"), newWire(br, bw, "sender")
	sender.noCompress, receiver.noCompress = senderRaw, receiverRaw
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var recvErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, recvErr = to.receiveTemplate(ctx, receiver, as, nil)
		bw.Close()
	}()
	m, err := from.chunked(ctx, "golden")
	if err != nil {
		t.Fatal(err)
	}
	res, sendErr := from.sendTemplate(ctx, sender, m, nil)
	aw.Close()
	<-done
	if sendErr != nil || recvErr != nil {
		t.Fatalf("transfer as %s: sender %v, receiver %v", as, sendErr, recvErr)
	}
	if sender.codec != receiver.codec {
		t.Fatalf("the sides agreed on %q and %q", sender.codec, receiver.codec)
	}
	return res, sender.out.Load(), sender.codec
}

// Chunks go zstd-compressed where that pays, raw where it does not, and
// raw to a receiver that takes no compression (an older vmfork) or from a
// sender that offers none; every way the template arrives whole.
func TestTransferCompression(t *testing.T) {
	from, to, tpl := compressiblePair(t)
	want, _ := os.ReadFile(tpl.Paths.RAM)
	check := func(as string) {
		t.Helper()
		got, err := to.Store.FindKept(as)
		if err != nil {
			t.Fatal(err)
		}
		have, _ := os.ReadFile(got.Paths.RAM)
		if !bytes.Equal(want, have) {
			t.Errorf("template %s: the received RAM differs from the sent one", as)
		}
		if err := to.Store.RemoveTemplate(got.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := to.Store.collectChunks(); err != nil {
			t.Fatal(err)
		}
	}
	_, zOut, codec := codecPair(t, from, to, "z", false, false)
	if codec != codecZstd {
		t.Fatalf("both sides take zstd: agreed %q", codec)
	}
	check("z")
	_, oldOut, codec := codecPair(t, from, to, "old-receiver", false, true)
	if codec != "" {
		t.Errorf("a receiver that takes none: agreed %q", codec)
	}
	check("old-receiver")
	_, rawOut, codec := codecPair(t, from, to, "old-sender", true, false)
	if codec != "" {
		t.Errorf("a sender that offers none: agreed %q", codec)
	}
	check("old-sender")
	// 4 MiB of text that compresses many times and 2 MiB of noise that
	// does not: compressed, the noise is most of what travels.
	if rawOut < 6<<20 || zOut > rawOut-3<<20 || zOut < 2<<20 || oldOut-rawOut != int64(len(`,"codecs":["zstd"]`)) {
		t.Errorf("bytes out: zstd %d, to a receiver without %d, raw %d; want zstd about 4 MiB less, the others equal but for the offer in the manifest", zOut, oldOut, rawOut)
	}
}

// A compressed frame is checked as a raw one: one that does not decode, or
// that was not agreed, is refused.
func TestFrameBody(t *testing.T) {
	z, _ := newChunkEncoder(codecZstd)
	dec, _ := newChunkDecoder(codecZstd)
	b := bytes.Repeat([]byte("page "), chunkSize/5)
	d := sha256Hex(b)
	kind, frame := compressFrame(z, encodeChunk(nil, d, b, nil))
	if kind != frameChunkZ || len(frame) > chunkSize/16 {
		t.Fatalf("a chunk of text: frame %q of %d bytes, want a small compressed one", kind, len(frame))
	}
	buf := make([]byte, 0, chunkBodyMax)
	body, err := frameBody(kind, frame[32:], dec, buf)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeChunk(body, nil, len(b), make([]byte, chunkSize))
	if err != nil || sha256Hex(got) != d {
		t.Fatalf("decode: %v", err)
	}
	if _, err := frameBody(kind, frame[32:], nil, buf); err == nil || !strings.Contains(err.Error(), "no compression was agreed") {
		t.Errorf("a compressed frame, none agreed: %v", err)
	}
	bad := bytes.Clone(frame[32:])
	bad[len(bad)/2] ^= 0xff
	if body, err := frameBody(kind, bad, dec, buf); err == nil {
		if got, err := decodeChunk(body, nil, len(b), make([]byte, chunkSize)); err == nil && sha256Hex(got) == d {
			t.Error("a damaged compressed frame gave the chunk back")
		}
	}
	// Noise does not compress: it goes raw.
	noise := make([]byte, chunkSize)
	rand.Read(noise)
	if kind, _ := compressFrame(z, encodeChunk(nil, sha256Hex(noise), noise, nil)); kind != frameChunk {
		t.Errorf("a chunk of noise went as %q, want raw", kind)
	}
	// A frame that inflates past a chunk is refused, not allocated.
	huge := z.EncodeAll(make([]byte, 3*chunkSize), nil)
	if _, err := frameBody(frameChunkZ, huge, dec, buf); err == nil {
		t.Error("a frame that inflates to 3 chunks decoded")
	}
}

// BenchmarkCompressFrame is compressFrame's cost per 2 MiB chunk of random
// bytes (tried, sent raw) and of od(1)'s hex of random bytes (sent
// compressed):
//
//	go test -run '^$' -bench CompressFrame .
func BenchmarkCompressFrame(b *testing.B) {
	noise := make([]byte, chunkSize)
	rand.Read(noise)
	// od -An -tx1's layout: " xx" per byte, 16 to a line. (Hex without
	// the spaces has no matches for zstd's fastest level, and it stores
	// that raw: the fastest level entropy-codes only around matches.)
	text := make([]byte, 0, chunkSize+64)
	for i := 0; len(text) < chunkSize; i++ {
		text = append(text, ' ')
		text = append(text, hex.EncodeToString(noise[i:i+1])...)
		if i%16 == 15 {
			text = append(text, '\n')
		}
	}
	text = text[:chunkSize]
	z, _ := newChunkEncoder(codecZstd)
	for _, c := range []struct {
		name string
		b    []byte
	}{{"random", noise}, {"hex", text}} {
		frame := encodeChunk(nil, sha256Hex(c.b), c.b, nil)
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(chunkSize)
			var out int
			for i := 0; i < b.N; i++ {
				_, f := compressFrame(z, frame)
				out = len(f)
			}
			b.ReportMetric(float64(out)/chunkSize, "ratio")
		})
	}
}

// Compressed chunks are encoded several at once and still leave in the
// order asked for; a sender that gives up midway stops the encoders.
func TestEncodeChunksOrder(t *testing.T) {
	s := newTestStore(t)
	cs := s.chunkStore()
	var want []chunkWant
	for i := range 24 {
		b := bytes.Repeat([]byte(fmt.Sprintf("chunk %d ", i)), 4096)
		if i%3 == 0 {
			rand.Read(b) // some go raw
		}
		d := sha256Hex(b)
		if err := cs.put(d, b); err != nil {
			t.Fatal(err)
		}
		want = append(want, chunkWant{Digest: d})
	}
	z, _ := newChunkEncoder(codecZstd)
	out, stop := make(chan encodedChunk), make(chan struct{})
	go encodeChunks(cs, want, z, out, stop)
	i, kinds := 0, map[byte]int{}
	for e := range out {
		if e.err != nil || e.digest != want[i].Digest || string(e.frame[:32]) != string(must(hex.DecodeString(e.digest))) {
			t.Fatalf("frame %d: %v, digest %s, want %s", i, e.err, e.digest, want[i].Digest)
		}
		kinds[e.kind]++
		i++
	}
	if i != len(want) || kinds[frameChunkZ] == 0 || kinds[frameChunk] == 0 {
		t.Errorf("%d frames (%v), want %d, some compressed and some raw", i, kinds, len(want))
	}
	close(stop)
	// Given up after the first frame: the channel closes.
	out, stop = make(chan encodedChunk), make(chan struct{})
	go encodeChunks(cs, want, z, out, stop)
	<-out
	close(stop)
	for range out {
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
