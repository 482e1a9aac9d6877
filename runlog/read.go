package runlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
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

// Read yields the lines of subject (bus.RunLogs or bus.SessionLogs) stored
// in WF_LOGS, in stream order, through an ordered consumer filtered on it.
// Without Follow it reads up to the last message stored when it starts,
// then yields each stream's trailing partial line and returns. It returns
// each's first error, or ctx's.
func Read(ctx context.Context, js jetstream.JetStream, subject string, opts Options, each func(Line) error) error {
	if err := opts.validate(); err != nil {
		return err
	}
	s, err := js.Stream(ctx, bus.StreamLogs)
	if err != nil {
		return fmt.Errorf("runlog: read %s: %w", subject, err)
	}
	rd := &reader{js: js, stream: s, subject: subject, opts: opts}
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
	js      jetstream.JetStream
	stream  jetstream.Stream
	subject string
	opts    Options

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
	m, err := rd.stream.GetLastMsgForSubject(ctx, rd.subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("runlog: last message of %s: %w", rd.subject, err)
	}
	if m.Time.Before(rd.opts.Since) {
		return 0, nil
	}
	return m.Sequence, nil
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
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{rd.subject}}
	switch {
	case from > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	case !rd.opts.Since.IsZero():
		t := rd.opts.Since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	c, err := rd.js.OrderedConsumer(ctx, bus.StreamLogs, cfg)
	if err != nil {
		return fmt.Errorf("runlog: read %s: %w", rd.subject, err)
	}
	it, err := c.Messages()
	if err != nil {
		return fmt.Errorf("runlog: read %s: %w", rd.subject, err)
	}
	defer it.Stop()

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
		var m jetstream.Msg
		if follow {
			m, err = it.Next(jetstream.NextContext(followCtx))
			if err != nil && ctx.Err() == nil && followCtx.Err() != nil {
				// Done: read up to what is stored now.
				if through, err = rd.lastSeq(ctx); err != nil {
					return err
				}
				follow = false
				continue
			}
		} else {
			m, err = it.Next(jetstream.NextMaxWait(drainPoll))
			if errors.Is(err, nats.ErrTimeout) {
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
			return fmt.Errorf("runlog: read %s: %w", rd.subject, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("runlog: read %s: %w", rd.subject, err)
		}
		rd.last = meta.Sequence.Stream
		if read++; read == 1 {
			rd.first = meta.Timestamp
		}
		if err := rd.add(m, meta, each); err != nil {
			return err
		}
	}
}

// add hands one message's chunk to rd.re if the options select it.
func (rd *reader) add(m jetstream.Msg, meta *jetstream.MsgMetadata, each func(Line) error) error {
	c, err := ParseChunk(m.Subject(), m.Headers(), m.Data(), meta)
	if err != nil {
		if rd.opts.Invalid != nil {
			rd.opts.Invalid(meta.Sequence.Stream, err)
		}
		return nil
	}
	if (rd.opts.Attempt != "" && c.Attempt != rd.opts.Attempt) || (rd.opts.Stream != "" && c.Stream != rd.opts.Stream) {
		return nil
	}
	return rd.re.Add(c, each)
}
