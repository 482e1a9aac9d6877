package runlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Msg is one stored message of the subject a Source reads.
type Msg struct {
	Subject string // the subject it was stored on
	Seq     uint64 // its stream sequence
	Time    time.Time
	Header  nats.Header
	Data    []byte
}

// Source is where a reader gets one subject's stored messages: the stream
// itself (StreamSource: an operator, or anyone whose login may read it), or
// the control plane's per-tenant read service (PageSource: a producer, whose
// login has no JetStream API). Read and the CLI's event reading take either.
type Source interface {
	// Last is the sequence and store time of the subject's last stored
	// message; 0 when it holds none.
	Last(ctx context.Context) (seq uint64, at time.Time, err error)
	// Open reads from stream sequence from; from 0 reads from since, or,
	// since zero, from the first message stored.
	Open(ctx context.Context, from uint64, since time.Time) (Cursor, error)
}

// Cursor yields a Source's messages in stream order.
type Cursor interface {
	// Next returns the next message. With wait > 0, ok is false when none
	// came within wait; with wait 0 it waits until ctx ends and returns
	// ctx's error.
	Next(ctx context.Context, wait time.Duration) (m Msg, ok bool, err error)
	// Stop ends the read and lets what it holds go.
	Stop()
}

// StreamSource reads subject from stream (bus.StreamLogs, bus.StreamEvents)
// through an ordered consumer filtered on it.
func StreamSource(js jetstream.JetStream, stream, subject string) Source {
	return &streamSource{js: js, stream: stream, subject: subject}
}

type streamSource struct {
	js              jetstream.JetStream
	stream, subject string
	st              jetstream.Stream
}

func (s *streamSource) handle(ctx context.Context) (jetstream.Stream, error) {
	if s.st != nil {
		return s.st, nil
	}
	st, err := s.js.Stream(ctx, s.stream)
	if err != nil {
		return nil, fmt.Errorf("runlog: read %s: %w", s.subject, err)
	}
	s.st = st
	return st, nil
}

func (s *streamSource) Last(ctx context.Context) (uint64, time.Time, error) {
	st, err := s.handle(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	m, err := st.GetLastMsgForSubject(ctx, s.subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, time.Time{}, nil
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("runlog: last message of %s: %w", s.subject, err)
	}
	return m.Sequence, m.Time, nil
}

func (s *streamSource) Open(ctx context.Context, from uint64, since time.Time) (Cursor, error) {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{s.subject}}
	switch {
	case from > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	case !since.IsZero():
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	c, err := s.js.OrderedConsumer(ctx, s.stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("runlog: read %s: %w", s.subject, err)
	}
	it, err := c.Messages()
	if err != nil {
		return nil, fmt.Errorf("runlog: read %s: %w", s.subject, err)
	}
	return streamCursor{it}, nil
}

type streamCursor struct{ it jetstream.MessagesContext }

func (c streamCursor) Next(ctx context.Context, wait time.Duration) (Msg, bool, error) {
	opt := jetstream.NextContext(ctx)
	if wait > 0 {
		opt = jetstream.NextMaxWait(wait)
	}
	m, err := c.it.Next(opt)
	if wait > 0 && errors.Is(err, nats.ErrTimeout) {
		return Msg{}, false, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return Msg{}, false, ctx.Err()
		}
		return Msg{}, false, err
	}
	meta, err := m.Metadata()
	if err != nil {
		return Msg{}, false, err
	}
	return Msg{Subject: m.Subject(), Seq: meta.Sequence.Stream, Time: meta.Timestamp, Header: m.Headers(), Data: m.Data()}, true, nil
}

func (c streamCursor) Stop() { c.it.Stop() }
