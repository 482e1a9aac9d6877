package runs

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// PublishEvents appends events of a Run of tenant to WF_EVENTS, each
// deduplicated by run:seq.
// Several go out together and are then awaited: one connection keeps their
// order in the stream, and a Run's accepted and decided events cost one
// round trip instead of two.
func (s *Store) PublishEvents(ctx context.Context, tenant string, evs []schemas.RunEvent) error {
	if len(evs) == 1 {
		return s.PublishEvent(ctx, tenant, evs[0], eventMsgID(evs[0]))
	}
	if err := s.publishUsage(ctx, tenant, evs); err != nil {
		return err
	}
	acks := make([]jetstream.PubAckFuture, 0, len(evs))
	for _, ev := range evs {
		m, err := eventMsg(tenant, ev)
		if err != nil {
			return err
		}
		s.eventsSent.Add(1)
		f, err := s.js.PublishMsgAsync(m, jetstream.WithMsgID(eventMsgID(ev)))
		if err != nil {
			return s.eventFailed(ev, eventMsgID(ev), err)
		}
		acks = append(acks, f)
	}
	timeout := time.NewTimer(eventPublishTimeout)
	defer timeout.Stop()
	for i, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return s.eventFailed(evs[i], eventMsgID(evs[i]), err)
		case <-timeout.C:
			return s.eventFailed(evs[i], eventMsgID(evs[i]), context.DeadlineExceeded)
		case <-ctx.Done():
			return s.eventFailed(evs[i], eventMsgID(evs[i]), ctx.Err())
		}
	}
	return nil
}

// eventPublishTimeout bounds waiting for WF_EVENTS to store an event.
const eventPublishTimeout = 5 * time.Second

func eventMsgID(ev schemas.RunEvent) string { return ev.RunID + ":" + strconv.FormatUint(ev.Seq, 10) }

// eventMsg is ev as JSON, the encoding operators read, on its tenant's
// subject.
func eventMsg(tenant string, ev schemas.RunEvent) (*nats.Msg, error) {
	b, err := codec.Encode(codec.JSON, ev)
	if err != nil {
		return nil, err
	}
	m := &nats.Msg{Subject: bus.RunEventsSubject(tenant, ev.RunID), Data: b, Header: nats.Header{}}
	m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
	return m, nil
}

// PublishEvent appends one event of tenant under msgID (a Run event's is
// run:seq; a rejection, which has no Run, names its intake message).
func (s *Store) PublishEvent(ctx context.Context, tenant string, ev schemas.RunEvent, msgID string) error {
	if err := s.publishUsage(ctx, tenant, []schemas.RunEvent{ev}); err != nil {
		return err
	}
	m, err := eventMsg(tenant, ev)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, eventPublishTimeout)
	defer cancel()
	s.eventsSent.Add(1)
	if _, err := s.js.PublishMsg(pctx, m, jetstream.WithMsgID(msgID)); err != nil {
		return s.eventFailed(ev, msgID, err)
	}
	return nil
}

func (s *Store) eventFailed(ev schemas.RunEvent, msgID string, err error) error {
	s.log.Warn("publish run event failed", zap.String("run_id", ev.RunID), zap.Uint64("seq", ev.Seq), zap.Error(err))
	return fmt.Errorf("publish event %s: %w", msgID, err)
}

// appendEvent numbers ev as r's next event, stamps it, and adds it to r's
// outbox, with its decision bounded (Compact) for storing and publishing.
func (s *Store) appendEvent(r *schemas.Run, ev schemas.RunEvent, now time.Time) {
	if ev.Decision != nil && len(ev.Decision.Candidates) > s.cfg.DecisionCandidates {
		d := ev.Decision.Compact(s.cfg.DecisionCandidates)
		ev.Decision = &d
	}
	r.EventSeq++
	ev.RunID, ev.Seq, ev.At = r.ID, r.EventSeq, now
	if ev.RequestID == "" && ev.Type == schemas.EventAccepted {
		ev.RequestID = r.Request.RequestID
	}
	r.Outbox = append(r.Outbox, ev)
}
