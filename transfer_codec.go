package vmfork

import (
	"fmt"
	"slices"

	"github.com/klauspost/compress/zstd"
)

// Compression on the wire. A chunk frame's body (encodeChunk's bitmap and
// the pages that differ) is sent zstd-compressed, as a frameChunkZ, when
// that saves at least 1/16 of it; otherwise raw, as a frameChunk. A guest's
// RAM holds kernel text, page cache and heaps that compress 2-4 times; data
// that is random already (or encrypted) does not, and goes raw, having cost
// the attempt (zstd's fastest level runs at several hundred MB/s a core).
// Digests stay over the uncompressed chunk: the receiver decompresses,
// rebuilds the chunk over its base and checks its sha256 as for a raw one.
//
// Negotiated in the manifest, so neither side needs the other's version:
// the sender lists the codecs it can send (manifestMsg.Codecs), the
// receiver names the one it takes (wantMsg.Codec) or none, and only then
// may a compressed frame come. An older receiver ignores the list and asks
// for none: it gets raw frames. An older sender lists none: it sends raw.
// A side started with --no-compress offers or takes none.

// frameChunkZ is a frameChunk whose body, after the digest, is one zstd frame.
const frameChunkZ = 'Z'

// codecZstd names zstd in the negotiation.
const codecZstd = "zstd"

// chunkBodyMax bounds what a chunk frame's body decodes to: a whole chunk
// and its page bitmap. The decoder refuses more (a frame that would
// inflate beyond it is refused, never allocated).
const chunkBodyMax = chunkSize + chunkSize/chunkPage/8

// offeredCodecs is what a sender lists in its manifest.
func (c *wire) offeredCodecs() []string {
	if c.noCompress {
		return nil
	}
	return []string{codecZstd}
}

// acceptCodec is the receiver's choice among what the sender offered.
func (c *wire) acceptCodec(offered []string) string {
	if !c.noCompress && slices.Contains(offered, codecZstd) {
		return codecZstd
	}
	return ""
}

// agreeCodec is the sender's check of the receiver's choice: one it
// offered, or none.
func (c *wire) agreeCodec(chosen string) error {
	if chosen == "" || slices.Contains(c.offeredCodecs(), chosen) {
		c.codec = chosen
		return nil
	}
	return fmt.Errorf("%s asked for chunks compressed as %q, which this side did not offer: %w", c.peer, chosen, ErrInvalid)
}

// newChunkEncoder returns the encoder for codec, nil for none. Its level is
// zstd's fastest: on the link it competes with ssh's cipher for the CPU.
func newChunkEncoder(codec string) (*zstd.Encoder, error) {
	if codec != codecZstd {
		return nil, nil
	}
	return zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(chunkWorkers),
		zstd.WithWindowSize(4<<20), zstd.WithEncoderCRC(false))
}

func newChunkDecoder(codec string) (*zstd.Decoder, error) {
	if codec != codecZstd {
		return nil, nil
	}
	return zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(chunkBodyMax),
		zstd.WithDecoderMaxWindow(8<<20))
}

// compressFrame returns frame (digest and body) as a frameChunkZ when
// compressing its body pays, else as it is.
func compressFrame(z *zstd.Encoder, frame []byte) (byte, []byte) {
	if z == nil || len(frame) <= 32+64 {
		return frameChunk, frame
	}
	body := len(frame) - 32
	zf := z.EncodeAll(frame[32:], append(make([]byte, 0, 32+body), frame[:32]...))
	if len(zf)-32 > body-body/16 {
		return frameChunk, frame
	}
	return frameChunkZ, zf
}

// frameBody returns a chunk frame's body, decompressed: kind is frameChunk
// or frameChunkZ, payload what follows the frame's digest. A compressed
// frame the receiver did not agree to (dec nil) is refused.
func frameBody(kind byte, payload []byte, dec *zstd.Decoder, buf []byte) ([]byte, error) {
	if kind == frameChunk {
		return payload, nil
	}
	if dec == nil {
		return nil, fmt.Errorf("a compressed chunk, and no compression was agreed")
	}
	b, err := dec.DecodeAll(payload, buf[:0])
	if err != nil {
		return nil, fmt.Errorf("zstd: %v", err)
	}
	return b, nil
}
