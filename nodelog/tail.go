package nodelog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Chunk is a span of one stream, read back to be shipped.
type Chunk struct {
	Stream Stream
	Offset int64
	Data   []byte
	// At is when the writer received the chunk's first byte (zero when the
	// times index has no record of it).
	At time.Time
	// Dropped counts bytes the rate limit dropped inside the span; the
	// markers in Data say so too.
	Dropped int64
}

// End is the offset just past the chunk.
func (c Chunk) End() int64 { return c.Offset + int64(len(c.Data)) }

// Tail reads one stream of an output directory from a position onwards.
type Tail struct {
	dir    string
	stream Stream
	pos    int64
	f      *os.File // opened once the data file exists
	times  timesReader
	// partialSince is when a line without its newline was first seen at
	// pos; it is shipped as it is once it has waited PartialAfter.
	partialSince time.Time
}

// PartialAfter is how long a line still being written is held back for its
// newline before it is shipped as it is.
const PartialAfter = time.Second

// NewTail reads stream s of dir from offset pos.
func NewTail(dir string, s Stream, pos int64) *Tail {
	return &Tail{dir: dir, stream: s, pos: pos, times: timesReader{path: timesPath(dir, s)}}
}

// Pos is the offset the next chunk starts at.
func (t *Tail) Pos() int64 { return t.pos }

// Next returns the next chunk of at most max bytes: whole lines, unless a
// single line is longer than max (then max bytes of it), or final holds
// (the writer is done: the rest as it is), or a partial line has waited
// PartialAfter. ok is false when nothing is ready yet. Next advances the
// position past what it returns.
func (t *Tail) Next(max int, final bool, now time.Time) (c Chunk, ok bool, err error) {
	buf, err := t.read(t.pos, max)
	if err != nil || len(buf) == 0 {
		return Chunk{}, false, err
	}
	n := len(buf)
	if i := bytes.LastIndexByte(buf, '\n'); i >= 0 {
		n = i + 1
		t.partialSince = time.Time{}
	} else if len(buf) < max && !final {
		if t.partialSince.IsZero() {
			t.partialSince = now
		}
		if now.Sub(t.partialSince) < PartialAfter {
			return Chunk{}, false, nil
		}
		t.partialSince = time.Time{}
	}
	c, err = t.At(Span{t.pos, t.pos + int64(n)}, buf[:n])
	if err != nil {
		return Chunk{}, false, err
	}
	t.pos = c.End()
	return c, true, nil
}

// At returns the chunk of span sp; data, when given, is its bytes already
// read. It does not move the position: the journal's unacknowledged spans
// are sent again through it.
func (t *Tail) At(sp Span, data []byte) (Chunk, error) {
	if data == nil {
		b, err := t.read(sp.Start, int(sp.End-sp.Start))
		if err != nil {
			return Chunk{}, err
		}
		if int64(len(b)) != sp.End-sp.Start {
			return Chunk{}, fmt.Errorf("nodelog: %s holds %d bytes at %d, the journal sent %d: the output file was truncated", t.stream, len(b), sp.Start, sp.End-sp.Start)
		}
		data = b
	}
	if err := t.times.refresh(); err != nil {
		return Chunk{}, err
	}
	at, dropped := t.times.span(sp.Start, sp.End)
	return Chunk{Stream: t.stream, Offset: sp.Start, Data: data, At: at, Dropped: dropped}, nil
}

// Close releases the data file.
func (t *Tail) Close() error {
	t.times.close()
	if t.f == nil {
		return nil
	}
	return t.f.Close()
}

func (t *Tail) read(off int64, max int) ([]byte, error) {
	if t.f == nil {
		f, err := os.Open(DataPath(t.dir, t.stream))
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("nodelog: open %s: %w", t.stream, err)
		}
		t.f = f
	}
	buf := make([]byte, max)
	n, err := t.f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("nodelog: read %s: %w", t.stream, err)
	}
	return buf[:n], nil
}
