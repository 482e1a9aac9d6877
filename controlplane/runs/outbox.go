package runs

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
//     publishes the Run's outbox again (Advance with redelivered set, when
//     the transition finds nothing to do; intake on a duplicate submit);
//   - a publish that failed after its CAS marks the Run, and the next
//     scheduling pass publishes what WF_EVENTS lacks (RepairOutboxes);
//   - the first pass of a replica does the same for every active Run.
//
// Events carry Nats-Msg-Id <run>:<seq>, so a repair inside WF_EVENTS'
// dedupe window stores nothing twice; the pass's repair reads the
// last event of the Run's subject first and publishes only later ones, so
// it adds no duplicates even after the window.

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

// all asks the next repair to check every active Run.
func (o *outboxRepair) markAll() {
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

// RepairOutboxes publishes the events WF_EVENTS lacks for the Runs marked
// for repair. A Run whose repair fails stays marked for the next pass.
func (s *Store) RepairOutboxes(ctx context.Context, active []*schemas.Run) {
	marked, all := s.repair.take()
	if len(marked) == 0 && !all {
		return
	}
	stream, err := s.js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		s.log.Warn("outbox repair: open events stream", zap.Error(err))
		s.remark(marked, all)
		return
	}
	repaired := 0
	for _, r := range active {
		if _, ok := marked[r.ID]; !ok && !all {
			continue
		}
		delete(marked, r.ID)
		n, err := s.repairOutbox(ctx, stream, *r)
		if err != nil {
			s.log.Warn("outbox repair", zap.String("run_id", r.ID), zap.Error(err))
			s.repair.mark(r.ID)
			continue
		}
		repaired += n
	}
	// Marked Runs that ended since: their last events are their outbox.
	for id := range marked {
		r, ok := s.cache.Run(id)
		if !ok {
			continue
		}
		n, err := s.repairOutbox(ctx, stream, r)
		if err != nil {
			s.log.Warn("outbox repair", zap.String("run_id", id), zap.Error(err))
			s.repair.mark(id)
			continue
		}
		repaired += n
	}
	if repaired > 0 {
		s.log.Info("published run events a previous attempt had not", zap.Int("events", repaired))
	}
}

func (s *Store) remark(marked map[string]struct{}, all bool) {
	for id := range marked {
		s.repair.mark(id)
	}
	if all {
		s.repair.markAll()
	}
}

// repairOutbox publishes the events of r's outbox that come after the last
// one WF_EVENTS holds for r, and returns how many it published.
func (s *Store) repairOutbox(ctx context.Context, stream jetstream.Stream, r schemas.Run) (int, error) {
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
		if err := s.PublishEvent(ctx, ev, eventMsgID(ev)); err != nil {
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

// RepairAllOnNextPass asks the next RepairOutboxes to check every active
// Run: a replica that starts cannot know where another stopped.
func (s *Store) RepairAllOnNextPass() { s.repair.markAll() }
