package runs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

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
// it adds no duplicates even after the window. Events published together
// can fail singly: an earlier one refused while a later one, retried by
// the client, is stored. Such a Run is marked with gaps, and its repair
// reads which of the outbox's events WF_EVENTS holds, not only the last.

// outboxRepair is the set of Runs whose outbox may not be in WF_EVENTS,
// each with whether it may lack an event before its last stored one.
type outboxRepair struct {
	mu   sync.Mutex
	runs map[string]bool
	all  bool
}

// mark notes that run id's outbox publish failed; gaps, that it was
// published as several events at once.
func (o *outboxRepair) mark(id string, gaps bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.runs == nil {
		o.runs = map[string]bool{}
	}
	o.runs[id] = o.runs[id] || gaps
}

// all asks the next repair to check every active Run.
func (o *outboxRepair) markAll() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all = true
}

// take returns the marked Runs (nil, true for all) and clears the marks.
func (o *outboxRepair) take() (map[string]bool, bool) {
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
		gaps, ok := marked[r.ID]
		if !ok && !all {
			continue
		}
		delete(marked, r.ID)
		repaired += s.repairRun(ctx, stream, *r, gaps)
	}
	// Marked Runs that ended since: their last events are their outbox.
	// The cache holds no ended Run, so each is read from wf_runs; one no
	// longer there has nothing left to publish.
	for id, gaps := range marked {
		r, found, err := s.Stored(ctx, id)
		switch {
		case err != nil:
			s.log.Warn("outbox repair", zap.String("run_id", id), zap.Error(err))
			s.repair.mark(id, gaps)
		case found:
			repaired += s.repairRun(ctx, stream, r, gaps)
		}
	}
	if repaired > 0 {
		s.log.Info("published run events a previous attempt had not", zap.Int("events", repaired))
	}
}

// repairRun repairs r's outbox, keeping r marked when that fails, and
// returns how many events it published.
func (s *Store) repairRun(ctx context.Context, stream jetstream.Stream, r schemas.Run, gaps bool) int {
	n, err := s.repairOutbox(ctx, stream, r, gaps)
	if err != nil {
		s.log.Warn("outbox repair", zap.String("run_id", r.ID), zap.Error(err))
		s.repair.mark(r.ID, gaps)
	}
	return n
}

func (s *Store) remark(marked map[string]bool, all bool) {
	for id, gaps := range marked {
		s.repair.mark(id, gaps)
	}
	if all {
		s.repair.markAll()
	}
}

// repairOutbox publishes the events of r's outbox that WF_EVENTS lacks and
// returns how many it published: those after the last one it holds for r
// and, with gaps, those before it that it does not hold.
func (s *Store) repairOutbox(ctx context.Context, stream jetstream.Stream, r schemas.Run, gaps bool) (int, error) {
	if len(r.Outbox) == 0 {
		return 0, nil
	}
	var last uint64
	m, err := stream.GetLastMsgForSubject(ctx, bus.RunEventsSubject(r.TenantOf(), r.ID))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return 0, err
	default:
		last = eventSeqOf(m.Header.Get(jetstream.MsgIDHeader), r.ID)
	}
	var held map[uint64]bool // nil: every event up to last is held
	if gaps && r.Outbox[0].Seq < last {
		if held, err = s.storedSeqs(ctx, r.TenantOf(), r.ID, r.Outbox[0].At.Add(-storedSeqsMargin)); err != nil {
			return 0, err
		}
	}
	n := 0
	for _, ev := range r.Outbox {
		if ev.Seq <= last && (held == nil || held[ev.Seq]) {
			continue
		}
		if err := s.PublishEvent(ctx, r.TenantOf(), ev, eventMsgID(ev)); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// storedSeqsMargin is how long before an outbox event's own time its
// message may have been stored by the server's clock.
const storedSeqsMargin = 5 * time.Minute

// storedSeqs reads which of runID's events WF_EVENTS holds from since on
// (by the server's clock): their headers only, through an ordered consumer.
func (s *Store) storedSeqs(ctx context.Context, tenant, runID string, since time.Time) (map[uint64]bool, error) {
	c, err := s.js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{bus.RunEventsSubject(tenant, runID)}, DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime: &since, HeadersOnly: true})
	if err != nil {
		return nil, fmt.Errorf("read stored events: %w", err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read stored events: %w", err)
	}
	held := map[uint64]bool{}
	for pending := info.NumPending; pending > 0; {
		batch, err := c.Fetch(int(min(pending, 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read stored events: %w", err)
		}
		got := uint64(0)
		for m := range batch.Messages() {
			held[eventSeqOf(m.Headers().Get(jetstream.MsgIDHeader), runID)] = true
			got++
		}
		if err := batch.Error(); err != nil || got == 0 {
			return nil, fmt.Errorf("read stored events: %d of %d read: %v", len(held), info.NumPending, err)
		}
		pending -= min(got, pending)
	}
	return held, nil
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
