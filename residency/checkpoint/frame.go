package checkpoint

import (
	"github.com/klauspost/compress/zstd"
)

// Chunk is a chunk as a Store keeps it: its bytes, zstd-compressed where
// that shrinks them by an eighth (incompressible data, such as model
// weights or archives, is kept as it is and costs no decode). Verified
// says the store itself checked, while reading, that Data hash to the
// digest the chunk is named by, so Restore need not hash them again.
type Chunk struct {
	Data       []byte
	Compressed bool
	Verified   bool
}

// codec seals and opens chunks and manifests. Its encoder and decoder are
// safe for concurrent use (EncodeAll and DecodeAll).
type codec struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
}

func newCodec() (*codec, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(MaxManifestBytes))
	if err != nil {
		enc.Close()
		return nil, err
	}
	return &codec{enc: enc, dec: dec}, nil
}

func (c *codec) close() {
	c.enc.Close()
	c.dec.Close()
}

// probeBytes is the sample seal compresses first: data whose first
// probeBytes do not shrink is kept raw without compressing the rest.
const probeBytes = 64 << 10

// seal makes data a Chunk, compressed where that pays.
func (c *codec) seal(data []byte) Chunk {
	if len(data) > 2*probeBytes && !c.shrinks(data[:probeBytes]) {
		return Chunk{Data: data}
	}
	z := c.enc.EncodeAll(data, make([]byte, 0, len(data)/2))
	if len(z) < len(data)-len(data)/8 {
		return Chunk{Data: z, Compressed: true}
	}
	return Chunk{Data: data}
}

// shrinks reports whether zstd saves an eighth of sample.
func (c *codec) shrinks(sample []byte) bool {
	z := c.enc.EncodeAll(sample, make([]byte, 0, len(sample)))
	return len(z) < len(sample)-len(sample)/8
}

// open returns a chunk's content, refusing more than limit bytes.
func (c *codec) open(ch Chunk, limit int64, what string) ([]byte, error) {
	if !ch.Compressed {
		if int64(len(ch.Data)) > limit {
			return nil, refuse(CodeCorrupt, what, "%d bytes, more than the %d expected", len(ch.Data), limit)
		}
		return ch.Data, nil
	}
	var head zstd.Header
	if err := head.Decode(ch.Data); err == nil && head.HasFCS && head.FrameContentSize > uint64(limit) {
		return nil, refuse(CodeCorrupt, what, "%d bytes, more than the %d expected", head.FrameContentSize, limit)
	}
	out, err := c.dec.DecodeAll(ch.Data, nil)
	if err != nil {
		return nil, refuse(CodeCorrupt, what, "does not decompress: %v", err)
	}
	if int64(len(out)) > limit {
		return nil, refuse(CodeCorrupt, what, "%d bytes, more than the %d expected", len(out), limit)
	}
	return out, nil
}
