package checkpoint

import (
	"github.com/klauspost/compress/zstd"
)

// A stored chunk or manifest is a frame: one byte naming its encoding,
// then the bytes. Content that zstd does not shrink by an eighth is kept
// raw, so incompressible data (model weights, archives) costs no decode.
const (
	frameRaw  byte = 'R'
	frameZstd byte = 'Z'
)

// codec seals and opens frames. Its encoder and decoder are safe for
// concurrent use (EncodeAll and DecodeAll).
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

// seal frames data, compressed where that pays.
func (c *codec) seal(data []byte) []byte {
	z := c.enc.EncodeAll(data, make([]byte, 1, 1+len(data)/2))
	if len(z)-1 < len(data)-len(data)/8 {
		z[0] = frameZstd
		return z
	}
	return append([]byte{frameRaw}, data...)
}

// open returns a frame's content, refusing more than limit bytes.
func (c *codec) open(frame []byte, limit int64, what string) ([]byte, error) {
	if len(frame) == 0 {
		return nil, refuse(CodeCorrupt, what, "empty frame")
	}
	switch frame[0] {
	case frameRaw:
		if int64(len(frame)-1) > limit {
			return nil, refuse(CodeCorrupt, what, "%d bytes, more than the %d expected", len(frame)-1, limit)
		}
		return frame[1:], nil
	case frameZstd:
		var head zstd.Header
		if err := head.Decode(frame[1:]); err == nil && head.HasFCS && head.FrameContentSize > uint64(limit) {
			return nil, refuse(CodeCorrupt, what, "%d bytes, more than the %d expected", head.FrameContentSize, limit)
		}
		out, err := c.dec.DecodeAll(frame[1:], nil)
		if err != nil {
			return nil, refuse(CodeCorrupt, what, "does not decompress: %v", err)
		}
		if int64(len(out)) > limit {
			return nil, refuse(CodeCorrupt, what, "%d bytes, more than the %d expected", len(out), limit)
		}
		return out, nil
	}
	return nil, refuse(CodeCorrupt, what, "unknown frame encoding %q", frame[0])
}
