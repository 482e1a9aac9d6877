package runlog

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
)

// Options select what Read yields.
type Options struct {
	Attempt string // only this attempt id; "" every attempt
	Stream  string // bus.LogStdout or bus.LogStderr; "" both
	// Since skips lines received before it. The consumer starts at the
	// first message stored from then, so older output costs nothing.
	Since time.Time
	// Tail > 0 yields only the last Tail lines (of those selected) stored
	// when Read starts, then, with Follow, what comes after. It reads back
	// from the end in growing windows rather than the whole subject.
	Tail int
	// Follow keeps reading new output. Read then returns when ctx ends or,
	// once Done is closed, when it has read what the stream held at that
	// moment (so the caller closes Done when the Run has ended).
	Follow bool
	Done   <-chan struct{}
	// Invalid is told of each message that is not a chunk (a *ChunkError)
	// and skipped; nil skips them silently.
	Invalid func(seq uint64, err error)
	// Gaps is told of each byte range of a stream no longer stored (its
	// chunks dropped by WF_LOGS's limits), before the bytes after it; nil
	// skips them silently. Without Since and Tail that includes a stream's
	// missing first bytes; with Tail, no gap is told.
	Gaps func(Gap)
}

func (o Options) validate() error {
	if o.Stream != "" && o.Stream != bus.LogStdout && o.Stream != bus.LogStderr {
		return fmt.Errorf("runlog: stream %q: want %s, %s or \"\" for both", o.Stream, bus.LogStdout, bus.LogStderr)
	}
	if o.Tail < 0 {
		return fmt.Errorf("runlog: tail %d: want a number of lines, or 0 for all", o.Tail)
	}
	return nil
}

// drainPoll is how long a read that is catching up waits for the next
// message before asking whether the messages it waits for still exist (the
// stream's limits may have removed them).
const drainPoll = time.Second

// firstWindow is how many stream sequences a tail reads back at first; each
// retry reads four times as many.
const firstWindow = 256

// Read yields the lines of subject (bus.RunLogsSubject or
// bus.SessionLogsSubject) stored in WF_LOGS, read through an ordered
// consumer filtered on it (StreamSource); ReadFrom reads any Source.
func Read(ctx context.Context, js jetstream.JetStream, subject string, opts Options, each func(Line) error) error {
	return ReadFrom(ctx, StreamSource(js, bus.StreamLogs, subject), opts, each)
}

// ReadFrom yields the lines of src's subject, in stream order. Without
// Follow it reads up to the last message stored when it starts, then
// yields each stream's trailing partial line and returns. It returns
// each's first error, or ctx's.
func ReadFrom(ctx context.Context, src Source, opts Options, each func(Line) error) error {
	if err := opts.validate(); err != nil {
		return err
	}
	rd := &reader{src: src, opts: opts}
	rd.re = rd.reassembler()
	end, err := rd.lastSeq(ctx)
	if err != nil {
		return err
	}
	var from uint64 // 0: from Since, or the start
	if opts.Tail > 0 && end > 0 {
		lines, err := rd.tail(ctx, end)
		if err != nil {
			return err
		}
		for _, l := range lines {
			if err := each(l); err != nil {
				return err
			}
		}
		if !opts.Follow {
			return nil
		}
		from = end + 1
	} else if !opts.Follow && end == 0 {
		return nil
	}
	if err := rd.scan(ctx, from, end, opts.Follow, rd.filter(each)); err != nil {
		return err
	}
	return rd.re.Flush(rd.filter(each))
}

type reader struct {
	src  Source
	opts Options

	re   Reassembler
	last uint64 // the stream sequence of the last message read
	// first is the store time of the first message the last scan read.
	first time.Time
}

// reassembler is a Reassembler told of gaps as opts ask. A tail's
// windows, read again and again, use a bare one.
func (rd *reader) reassembler() Reassembler {
	if rd.opts.Tail > 0 {
		return Reassembler{}
	}
	return Reassembler{FromStart: rd.opts.Since.IsZero(), Gaps: rd.opts.Gaps}
}

// lastSeq is the sequence of subject's last message, 0 when there is none
// or it was stored before Since.
func (rd *reader) lastSeq(ctx context.Context) (uint64, error) {
	seq, at, err := rd.src.Last(ctx)
	if err != nil || at.Before(rd.opts.Since) {
		return 0, err
	}
	return seq, nil
}

// tail reads back from end in growing windows until one holds more than
// Tail lines or reaches the start (or Since), and returns its last Tail
// lines. With Follow it leaves a trailing partial line in rd.re for what
// follows; without, it counts it as a line.
func (rd *reader) tail(ctx context.Context, end uint64) ([]Line, error) {
	n := rd.opts.Tail
	for window := uint64(firstWindow); ; window *= 4 {
		start := uint64(1)
		if end > window {
			start = end - window + 1
		}
		ring, seen := make([]Line, n), 0
		keep := rd.filter(func(l Line) error {
			ring[seen%n] = l
			seen++
			return nil
		})
		rd.re, rd.last, rd.first = Reassembler{}, 0, time.Time{}
		if err := rd.scan(ctx, start, end, false, keep); err != nil {
			return nil, err
		}
		if !rd.opts.Follow {
			_ = rd.re.Flush(keep)
		}
		if seen > n || start == 1 || rd.first.Before(rd.opts.Since) {
			out := make([]Line, 0, min(seen, n))
			for i := max(seen-n, 0); i < seen; i++ {
				out = append(out, ring[i%n])
			}
			return out, nil
		}
	}
}

// filter passes on the lines Since selects.
func (rd *reader) filter(each func(Line) error) func(Line) error {
	if rd.opts.Since.IsZero() {
		return each
	}
	return func(l Line) error {
		if l.Time.Before(rd.opts.Since) {
			return nil
		}
		return each(l)
	}
}

// scan reads subject's messages from stream sequence from (0: from Since,
// or the start) into rd.re. Without follow it stops once it has read up to
// sequence through; with follow, when ctx ends, or when Done is closed
// and it has read up to what was stored then.
func (rd *reader) scan(ctx context.Context, from, through uint64, follow bool, each func(Line) error) error {
	since := time.Time{}
	if from == 0 {
		since = rd.opts.Since
	}
	cur, err := rd.src.Open(ctx, from, since)
	if err != nil {
		return err
	}
	defer cur.Stop()

	followCtx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	if follow && rd.opts.Done != nil {
		go func() {
			select {
			case <-rd.opts.Done:
				stopFollow()
			case <-followCtx.Done():
			}
		}()
	}
	read := uint64(0)
	for {
		if !follow && rd.last >= through {
			return nil
		}
		var m Msg
		var ok bool
		if follow {
			m, ok, err = cur.Next(followCtx, 0)
			if err != nil && ctx.Err() == nil && followCtx.Err() != nil {
				// Done: read up to what is stored now.
				if through, err = rd.lastSeq(ctx); err != nil {
					return err
				}
				follow = false
				continue
			}
		} else {
			m, ok, err = cur.Next(ctx, drainPoll)
			if err == nil && !ok {
				now, err := rd.lastSeq(ctx)
				if err != nil {
					return err
				}
				if now <= rd.last {
					return nil // what it waited for was removed
				}
				continue
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("runlog: read: %w", err)
		}
		rd.last = m.Seq
		if read++; read == 1 {
			rd.first = m.Time
		}
		if err := rd.add(m, each); err != nil {
			return err
		}
	}
}

// add hands one message's chunk to rd.re if the options select it.
func (rd *reader) add(m Msg, each func(Line) error) error {
	meta := &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.Seq}, Timestamp: m.Time}
	c, err := ParseChunk(m.Subject, m.Header, m.Data, meta)
	if err != nil {
		if rd.opts.Invalid != nil {
			rd.opts.Invalid(m.Seq, err)
		}
		return nil
	}
	if (rd.opts.Attempt != "" && c.Attempt != rd.opts.Attempt) || (rd.opts.Stream != "" && c.Stream != rd.opts.Stream) {
		return nil
	}
	return rd.re.Add(c, each)
}
