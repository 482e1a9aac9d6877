package runs

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// publishUsage publishes the usage record of each attempt_ended event in
// evs on WF_USAGE, and waits for each to be stored, before the events
// themselves go out: a repair publishes only the events WF_EVENTS lacks,
// so an event stored while its record was not would leave the record
// unpublished for good. Nats-Msg-Id usage:<attempt id> makes a record
// published again by a repair one record.
func (s *Store) publishUsage(ctx context.Context, tenant string, evs []schemas.RunEvent) error {
	for _, ev := range evs {
		rec, ok := UsageOf(tenant, ev)
		if !ok {
			continue
		}
		b, err := codec.Encode(codec.JSON, rec)
		if err != nil {
			return err
		}
		m := &nats.Msg{Subject: bus.UsageSubject(tenant), Data: b, Header: nats.Header{}}
		m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
		pctx, cancel := context.WithTimeout(ctx, eventPublishTimeout)
		_, err = s.js.PublishMsg(pctx, m, jetstream.WithMsgID(bus.UsageMsgID(rec.AttemptID)))
		cancel()
		if err != nil {
			s.log.Warn("publish usage record failed", zap.String("run_id", ev.RunID), zap.String("attempt_id", rec.AttemptID), zap.Error(err))
			return fmt.Errorf("publish usage of %s: %w", rec.AttemptID, err)
		}
	}
	return nil
}

// UsageOf is the usage record an attempt_ended event of tenant's Run
// carries; ok is false for any other event, or one without its record.
func UsageOf(tenant string, ev schemas.RunEvent) (rec schemas.UsageRecord, ok bool) {
	u := ev.Usage
	if ev.Type != schemas.EventAttemptEnded || u == nil {
		return rec, false
	}
	rec = schemas.UsageRecord{
		RunID: ev.RunID, Tenant: tenant, AttemptID: schemas.WorkloadID(ev.RunID, u.Attempt), NodeID: u.NodeID,
		GPUModel: u.GPUModel, GPUs: u.GPUs, EndedAt: ev.At, CostUSD: u.CostUSD, Outcome: u.Outcome,
	}
	if u.EndedAt != nil {
		rec.EndedAt = *u.EndedAt
	}
	if u.HeldFrom != nil {
		rec.HeldFrom = *u.HeldFrom
		rec.Seconds = max(0, rec.EndedAt.Sub(rec.HeldFrom).Seconds())
	}
	return rec, true
}
