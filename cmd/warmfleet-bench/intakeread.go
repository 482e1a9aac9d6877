package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// submitTemplate is a sample submit body split around its request id. Each
// producer message is the sample with its own id spliced in, so intake's
// producers spend what the baseline's spend (which publish one fixed body):
// the measured difference is the control plane's, not the bench's encoding.
type submitTemplate struct{ head, tail []byte }

// newSubmitTemplate splits data around rid, which must occur exactly once.
// Spliced ids must be as long as rid, so a msgpack string header stays valid.
func newSubmitTemplate(data []byte, rid string) (submitTemplate, error) {
	if n := bytes.Count(data, []byte(rid)); n != 1 {
		return submitTemplate{}, fmt.Errorf("sample submit holds its request id %d times, want 1", n)
	}
	i := bytes.Index(data, []byte(rid))
	return submitTemplate{head: data[:i], tail: data[i+len(rid):]}, nil
}

func (t submitTemplate) body(rid string) []byte {
	b := make([]byte, 0, len(t.head)+len(rid)+len(t.tail))
	return append(append(append(b, t.head...), rid...), t.tail...)
}

// storedEvent is one Run event as WF_EVENTS holds it, with the time the
// server stored it: the moment it became durable.
type storedEvent struct {
	runID, typ string
	// decided: the event records a decision (a decided event, or an
	// accepted one carrying the decision made at intake).
	decided bool
	at      time.Time
}

// readEvents reads WF_EVENTS from sequence from to the stream's end, after
// the measured window, so that observing the events costs the measurement
// nothing: a live subscriber would take every event's delivery out of the
// same two cores that intake runs on.
func readEvents(ctx context.Context, js jetstream.JetStream, from uint64) ([]storedEvent, error) {
	next, err := eventsFrom(ctx, js)
	if err != nil {
		return nil, err
	}
	if next <= from {
		return nil, nil
	}
	last := next - 1
	c, err := js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from})
	if err != nil {
		return nil, err
	}
	it, err := c.Messages(jetstream.PullMaxMessages(4096))
	if err != nil {
		return nil, err
	}
	defer it.Stop()
	out := make([]storedEvent, 0, last-from+1)
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return out, fmt.Errorf("read WF_EVENTS back at %d of %d: %w", len(out), last-from+1, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return out, err
		}
		var ev struct {
			Type     string          `json:"type"`
			Decision json.RawMessage `json:"decision"`
		}
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			return out, fmt.Errorf("event %d: %w", meta.Sequence.Stream, err)
		}
		decided := ev.Type == string(schemas.EventDecided) || (ev.Type == string(schemas.EventAccepted) && len(ev.Decision) > 0 && string(ev.Decision) != "null")
		out = append(out, storedEvent{runID: strings.TrimPrefix(m.Subject(), bus.RunEventsSubject(schemas.DefaultTenant, "")), typ: ev.Type, decided: decided, at: meta.Timestamp})
		if meta.Sequence.Stream >= last {
			return out, nil
		}
	}
}

// eventsFrom is the sequence the next stored event will get.
func eventsFrom(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	s, err := js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq + 1, nil
}

// errDrain: the control plane did not store the events in time.
var errDrain = errors.New("drain timed out")

// waitEvents polls WF_EVENTS every 10 ms until the next event it stores
// would get sequence next (every event before it is stored), or the
// deadline passes.
func waitEvents(ctx context.Context, js jetstream.JetStream, next uint64, deadline time.Time) error {
	return poll(ctx, 10*time.Millisecond, deadline, func() (bool, error) {
		at, err := eventsFrom(ctx, js)
		return err == nil && at >= next, nil
	}, func() error { return errDrain })
}
