package nodelog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// The shipping journal is the agent's memory of what it sent: before a
// chunk is published its span is recorded (an intent), after JetStream
// acknowledges it the acknowledged end is, and once a stream's closing
// message is stored, that too. After a restart the agent publishes every
// intent past the acknowledged end again, byte for byte the same span, so
// JetStream's dedupe (Nats-Msg-Id = attempt, stream, offset) stores each
// chunk once; then it goes on from the last intent's end.
//
// Records are fixed-size and appended; a torn last record is ignored.
const (
	recIntent byte = 'I'
	recAcked  byte = 'A'
	recEnded  byte = 'E'
	recSize        = 18 // kind, stream, two uint64
)

// Span is the bytes [Start, End) of one stream.
type Span struct{ Start, End int64 }

// StreamState is what the journal says of one stream.
type StreamState struct {
	// Acked: every byte before it is stored.
	Acked int64
	// Unacked are the spans sent but not known to be stored, in order; they
	// are sent again exactly.
	Unacked []Span
	// Next is where the next new chunk starts.
	Next int64
	// Ended: the closing message is stored; Length is the stream's size.
	Ended  bool
	Length int64
}

// Journal appends shipping records to an output directory's journal.
type Journal struct{ f *os.File }

// ErrCorruptJournal: a journal record that cannot have been written by
// this package (unknown kind or stream, a span going backwards).
var ErrCorruptJournal = errors.New("nodelog: corrupt shipping journal")

// OpenJournal opens (creating) dir's journal and returns what it says.
func OpenJournal(dir string) (*Journal, [2]StreamState, error) {
	path := filepath.Join(dir, journalFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, [2]StreamState{}, fmt.Errorf("nodelog: open journal: %w", err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, [2]StreamState{}, fmt.Errorf("nodelog: read journal: %w", err)
	}
	st, used, err := ParseJournal(b)
	if err != nil {
		f.Close()
		return nil, st, fmt.Errorf("%w (%s)", err, path)
	}
	if used != len(b) {
		// Drop the torn record so the next append starts on a boundary.
		if err := f.Truncate(int64(used)); err != nil {
			f.Close()
			return nil, st, fmt.Errorf("nodelog: trim journal: %w", err)
		}
	}
	return &Journal{f: f}, st, nil
}

// ParseJournal replays journal bytes: the state they describe and how many
// bytes of whole records they hold.
func ParseJournal(b []byte) (st [2]StreamState, used int, err error) {
	for ; len(b)-used >= recSize; used += recSize {
		r := b[used : used+recSize]
		kind, s := r[0], int(r[1])
		a, e := int64(binary.LittleEndian.Uint64(r[2:])), int64(binary.LittleEndian.Uint64(r[10:]))
		if s > 1 || a < 0 || e < a {
			return st, used, ErrCorruptJournal
		}
		ss := &st[s]
		switch kind {
		case recIntent:
			if a != ss.Next {
				return st, used, fmt.Errorf("%w: %s intent at %d, expected %d", ErrCorruptJournal, Stream(s), a, ss.Next)
			}
			ss.Unacked = append(ss.Unacked, Span{a, e})
			ss.Next = e
		case recAcked:
			if e > ss.Next {
				return st, used, fmt.Errorf("%w: %s acknowledged to %d past its last intent %d", ErrCorruptJournal, Stream(s), e, ss.Next)
			}
			ss.Acked = max(ss.Acked, e)
			for len(ss.Unacked) > 0 && ss.Unacked[0].End <= ss.Acked {
				ss.Unacked = ss.Unacked[1:]
			}
		case recEnded:
			ss.Ended, ss.Length = true, e
		default:
			return st, used, ErrCorruptJournal
		}
	}
	return st, used, nil
}

func (j *Journal) write(kind byte, s Stream, a, e int64) error {
	var r [recSize]byte
	r[0], r[1] = kind, byte(s)
	binary.LittleEndian.PutUint64(r[2:], uint64(a))
	binary.LittleEndian.PutUint64(r[10:], uint64(e))
	if _, err := j.f.Write(r[:]); err != nil {
		return fmt.Errorf("nodelog: journal: %w", err)
	}
	return nil
}

// Intent records that span is about to be sent.
func (j *Journal) Intent(s Stream, sp Span) error { return j.write(recIntent, s, sp.Start, sp.End) }

// Acked records that every byte of s before end is stored.
func (j *Journal) Acked(s Stream, end int64) error { return j.write(recAcked, s, 0, end) }

// Ended records that s's closing message, at length, is stored.
func (j *Journal) Ended(s Stream, length int64) error { return j.write(recEnded, s, 0, length) }

// Close closes the journal file.
func (j *Journal) Close() error { return j.f.Close() }
