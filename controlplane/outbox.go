package controlplane

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// A Run's last change keeps its events in the Run's Outbox until the next
// change. They are published after the CAS that stored them; when that
// publish does not happen (a failed publish, a replica that stopped in
// between), one of these repairs it:
//
//   - a redelivered intake or observation message, or a duplicate submit,
//     publishes the Run's outbox again (advance, on ErrNoChange, when the
//     context is marked by withRedelivery; submit on a duplicate);
//   - a publish that failed after its CAS marks the Run, and the next
//     reconcile pass publishes what WF_EVENTS lacks;
//   - the first reconcile pass of a replica does the same for every active
//     Run.
//
// Events carry Nats-Msg-Id <run>:<seq>, so a repair inside WF_EVENTS'
// dedupe window stores nothing twice; the reconcile-pass repair reads the
// last event of the Run's subject first and publishes only later ones, so
// it adds no duplicates even after the window.

type redeliveryKey struct{}

// withRedelivery marks ctx when m has been delivered before: the handler's
// earlier attempt may have written a change without publishing its events.
func withRedelivery(ctx context.Context, m jetstream.Msg) context.Context {
	if meta, err := m.Metadata(); err == nil && meta.NumDelivered > 1 {
		return markRepair(ctx)
	}
	return ctx
}

// markRepair marks ctx so that advance republishes a Run's outbox when the
// change finds nothing to do.
func markRepair(ctx context.Context) context.Context {
	return context.WithValue(ctx, redeliveryKey{}, true)
}

// repairing reports whether ctx is marked by markRepair.
func repairing(ctx context.Context) bool {
	v, _ := ctx.Value(redeliveryKey{}).(bool)
	return v
}

// outboxRepair is the set of Runs whose outbox may not be in WF_EVENTS.
type outboxRepair struct {
	mu   sync.Mutex
	runs map[string]struct{}
	all  bool
}

// mark notes that run id's outbox publish failed.
func (o *outboxRepair) mark(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.runs == nil {
		o.runs = map[string]struct{}{}
	}
	o.runs[id] = struct{}{}
}

// repairAllOnNextPass asks the next pass to check every active Run.
func (o *outboxRepair) repairAllOnNextPass() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all = true
}

// take returns the marked Runs (nil, true for all) and clears the marks.
func (o *outboxRepair) take() (map[string]struct{}, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	runs, all := o.runs, o.all
	o.runs, o.all = nil, false
	return runs, all
}

// repairOutboxes publishes the events WF_EVENTS lacks for the Runs marked
// for repair. A Run whose repair fails stays marked for the next pass.
func (cp *ControlPlane) repairOutboxes(ctx context.Context, active []*schemas.Run) {
	marked, all := cp.outbox.take()
	if len(marked) == 0 && !all {
		return
	}
	stream, err := cp.conn.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		cp.log.Warn("outbox repair: open events stream", zap.Error(err))
		cp.remark(marked, all)
		return
	}
	repaired := 0
	for _, r := range active {
		if _, ok := marked[r.ID]; !ok && !all {
			continue
		}
		delete(marked, r.ID)
		n, err := cp.repairOutbox(ctx, stream, *r)
		if err != nil {
			cp.log.Warn("outbox repair", zap.String("run_id", r.ID), zap.Error(err))
			cp.outbox.mark(r.ID)
			continue
		}
		repaired += n
	}
	// Marked Runs that ended since: their last events are their outbox.
	for id := range marked {
		r, ok := cp.cache.run(id)
		if !ok {
			continue
		}
		n, err := cp.repairOutbox(ctx, stream, r)
		if err != nil {
			cp.log.Warn("outbox repair", zap.String("run_id", id), zap.Error(err))
			cp.outbox.mark(id)
			continue
		}
		repaired += n
	}
	if repaired > 0 {
		cp.log.Info("published run events a previous attempt had not", zap.Int("events", repaired))
	}
}

func (cp *ControlPlane) remark(marked map[string]struct{}, all bool) {
	for id := range marked {
		cp.outbox.mark(id)
	}
	if all {
		cp.outbox.repairAllOnNextPass()
	}
}

// repairOutbox publishes the events of r's outbox that come after the last
// one WF_EVENTS holds for r, and returns how many it published.
func (cp *ControlPlane) repairOutbox(ctx context.Context, stream jetstream.Stream, r schemas.Run) (int, error) {
	if len(r.Outbox) == 0 {
		return 0, nil
	}
	var last uint64
	m, err := stream.GetLastMsgForSubject(ctx, bus.RunEvents(r.ID))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return 0, err
	default:
		last = eventSeqOf(m.Header.Get(jetstream.MsgIDHeader), r.ID)
	}
	n := 0
	for _, ev := range r.Outbox {
		if ev.Seq <= last {
			continue
		}
		if err := cp.publishEvent(ctx, ev, eventMsgID(ev)); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// eventSeqOf reads seq from a Run event's message id <run>:<seq>; 0 when
// it is not one (a rejection's id).
func eventSeqOf(msgID, runID string) uint64 {
	s, ok := strings.CutPrefix(msgID, runID+":")
	if !ok {
		return 0
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0
	}
	return n
}
