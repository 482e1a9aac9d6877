package nodelog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// The times index says when the writer received each write it stored: one
// fixed-size record per write, appended after the write itself. Dropped is
// how many bytes the rate limit dropped just before this write (the write
// is then the marker that says so).
type mark struct {
	Offset  int64
	At      time.Time
	Dropped int64
}

const markSize = 24

func (m mark) append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(m.Offset))
	b = binary.LittleEndian.AppendUint64(b, uint64(m.At.UnixNano()))
	return binary.LittleEndian.AppendUint64(b, uint64(m.Dropped))
}

// decodeMarks reads whole records from b; a torn last record (a crash in
// the middle of its write) is left for the next read.
func decodeMarks(b []byte) (marks []mark, used int) {
	for len(b)-used >= markSize {
		r := b[used : used+markSize]
		marks = append(marks, mark{
			Offset:  int64(binary.LittleEndian.Uint64(r[0:])),
			At:      time.Unix(0, int64(binary.LittleEndian.Uint64(r[8:]))).UTC(),
			Dropped: int64(binary.LittleEndian.Uint64(r[16:])),
		})
		used += markSize
	}
	return marks, used
}

// timesReader follows one stream's index, keeping only the marks at or
// after the reader's position (and the one before it, which dates it).
type timesReader struct {
	path  string
	f     *os.File // opened once the index exists
	off   int64    // bytes of the index consumed
	marks []mark
}

// refresh reads the records appended since the last call.
func (t *timesReader) refresh() error {
	if t.f == nil {
		f, err := os.Open(t.path)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("nodelog: open times index: %w", err)
		}
		t.f = f
	}
	b, err := io.ReadAll(io.NewSectionReader(t.f, t.off, 1<<40))
	if err != nil {
		return fmt.Errorf("nodelog: read times index: %w", err)
	}
	marks, used := decodeMarks(b)
	t.off += int64(used)
	t.marks = append(t.marks, marks...)
	return nil
}

func (t *timesReader) close() {
	if t.f != nil {
		t.f.Close()
	}
}

// span dates the bytes [start, end): when the write holding start arrived,
// and how many bytes were dropped inside the span. It forgets marks
// before start's, which no later span needs.
func (t *timesReader) span(start, end int64) (at time.Time, dropped int64) {
	first := 0
	for i, m := range t.marks {
		if m.Offset <= start {
			first = i
			at = m.At
		}
		if m.Offset >= start && m.Offset < end {
			dropped += m.Dropped
		}
	}
	t.marks = t.marks[first:]
	return at, dropped
}
