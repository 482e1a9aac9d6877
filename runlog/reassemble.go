package runlog

import (
	"bytes"
	"time"
)

// Line is one line of one attempt's stdout or stderr.
type Line struct {
	Attempt string `json:"attempt"`
	Node    string `json:"node,omitempty"`
	Stream  string `json:"stream"`
	// Time is when the node received the chunk holding the line's first
	// byte.
	Time time.Time `json:"time"`
	Text string    `json:"text"` // without its "\n"
	// Partial: Text does not end a line, so no "\n" follows it. The line
	// was longer than maxLine and goes on in the stream's next Line, or
	// these are the stream's last bytes, written without a final newline,
	// or the bytes after them are no longer stored (Gap).
	Partial bool `json:"partial,omitempty"`
}

// Gap is a byte range of one stream that WF_LOGS no longer holds: its
// chunks were dropped by the stream's limits (age, size, the per-subject
// cap; bus/logs.go) before they were read.
type Gap struct {
	Attempt, Stream string
	From, To        int64 // the bytes [From, To)
}

// maxLine bounds a line the Reassembler holds back waiting for its "\n":
// a longer one is yielded in pieces of about this size.
const maxLine = 1 << 20

// Reassembler turns chunks, in stream order, into lines: each byte of each
// (attempt, stream) once, in offset order. It tracks the next offset it
// expects per (attempt, stream) and skips or cuts what it already has (a
// chunk stored twice, or one overlapping an earlier one). The first chunk
// of a stream may start anywhere (older ones aged out, or were skipped by
// a start time); a later jump forward (bytes no longer stored) ends the
// pending partial line. A line split across chunks is yielded once whole;
// a stream's trailing partial line at its end mark, or at Flush. The zero
// value is ready to use; it is not safe for concurrent use.
type Reassembler struct {
	// FromStart says the chunks read are all those stored, from the
	// first: a stream's first chunk starting past byte 0 is then a Gap
	// too (its oldest chunks were dropped), not a reader starting late.
	FromStart bool
	// Gaps is told of each range of bytes no longer stored; nil: none.
	Gaps func(Gap)

	streams map[streamKey]*streamState
	order   []streamKey // first seen first, for Flush
}

type streamKey struct{ attempt, stream string }

type streamState struct {
	next    int64 // the offset of the next byte to deliver
	started bool
	partial []byte    // a line without its "\n" yet
	ptime   time.Time // when partial's first byte was received
	node    string
}

// Add takes the next chunk in stream order and calls each for every line
// it completes. It returns each's first error.
func (r *Reassembler) Add(c Chunk, each func(Line) error) error {
	st := r.state(c)
	if c.Node != "" {
		st.node = c.Node
	}
	if c.End {
		return st.flush(c, each)
	}
	data, off := c.Data, c.Offset
	if !st.started {
		st.started, st.next = true, off
		if r.FromStart && off > 0 {
			r.gap(Gap{Attempt: c.Attempt, Stream: c.Stream, From: 0, To: off})
		}
	}
	end := off + int64(len(data))
	if end <= st.next {
		return nil // delivered already
	}
	if off < st.next {
		data = data[st.next-off:]
	} else if off > st.next {
		if err := st.flush(c, each); err != nil {
			return err
		}
		r.gap(Gap{Attempt: c.Attempt, Stream: c.Stream, From: st.next, To: off})
	}
	st.next = end
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			if len(st.partial) == 0 {
				st.ptime = c.Time
			}
			st.partial = append(st.partial, data...)
			if len(st.partial) >= maxLine {
				return st.flush(c, each)
			}
			return nil
		}
		t, text := c.Time, data[:i]
		if len(st.partial) > 0 {
			t, text = st.ptime, append(st.partial, text...)
		}
		l := Line{Attempt: c.Attempt, Node: st.node, Stream: c.Stream, Time: t, Text: string(text)}
		st.clear()
		if err := each(l); err != nil {
			return err
		}
		data = data[i+1:]
	}
	return nil
}

func (r *Reassembler) gap(g Gap) {
	if r.Gaps != nil {
		r.Gaps(g)
	}
}

// Flush yields every stream's trailing partial line, streams in the order
// they were first seen.
func (r *Reassembler) Flush(each func(Line) error) error {
	for _, k := range r.order {
		if err := r.streams[k].flush(Chunk{Attempt: k.attempt, Stream: k.stream}, each); err != nil {
			return err
		}
	}
	return nil
}

func (r *Reassembler) state(c Chunk) *streamState {
	k := streamKey{c.Attempt, c.Stream}
	st := r.streams[k]
	if st == nil {
		if r.streams == nil {
			r.streams = map[streamKey]*streamState{}
		}
		st = &streamState{}
		r.streams[k] = st
		r.order = append(r.order, k)
	}
	return st
}

// flush yields the partial line, if any, as a line of c's stream that no
// "\n" ends.
func (st *streamState) flush(c Chunk, each func(Line) error) error {
	if len(st.partial) == 0 {
		return nil
	}
	l := Line{Attempt: c.Attempt, Node: st.node, Stream: c.Stream, Time: st.ptime, Text: string(st.partial), Partial: true}
	st.clear()
	return each(l)
}

// clear empties partial, letting a long line's buffer go.
func (st *streamState) clear() {
	if cap(st.partial) > 64<<10 {
		st.partial = nil
	} else {
		st.partial = st.partial[:0]
	}
}
