package sessions

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// events publishes session events to WF_EVENTS (bus.SessionEventsSubject),
// each with a message id naming what it records, so a repeat (a retried
// commit, a re-answered attach) is stored once. An event that cannot be
// published is logged: what it records is already committed.
type events struct {
	js  jetstream.JetStream
	now func() time.Time
	log *zap.Logger
}

// attached records that v's session became resident, from the checkpoint
// it restored.
func (e events) attached(ctx context.Context, v schemas.ResidencyView) {
	e.publish(ctx, fmt.Sprintf("attached-%d", v.Epoch), schemas.SessionEvent{
		Type: schemas.SessionAttached, Tenant: v.Tenant, Session: v.Session, Node: v.Host, Epoch: v.Epoch, Restored: v.Restored,
	})
}

// checkpointed records a committed checkpoint.
func (e events) checkpointed(ctx context.Context, cp residency.Checkpoint) {
	e.publish(ctx, fmt.Sprintf("checkpoint-%d-%d", cp.Sequence, cp.Epoch), schemas.SessionEvent{
		Type: schemas.SessionCheckpointed, Tenant: cp.Key.Tenant, Session: cp.Key.Session, Node: cp.Host, Epoch: cp.Epoch,
		Sequence: cp.Sequence, Checkpoint: cp.Content,
	})
}

func (e events) publish(ctx context.Context, what string, ev schemas.SessionEvent) {
	ev.At = e.now()
	b, err := json.Marshal(ev)
	if err == nil {
		key := residency.Key{Tenant: ev.Tenant, Session: ev.Session}
		_, err = e.js.Publish(ctx, bus.SessionEventsSubject(ev.Tenant, ev.Session), b, jetstream.WithMsgID("session-"+key.String()+"-"+what))
	}
	if err != nil {
		e.log.Warn("session event not published", zap.String("type", string(ev.Type)), zap.String("tenant", ev.Tenant),
			zap.String("session", ev.Session), zap.Error(err))
	}
}
