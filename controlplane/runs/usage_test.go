package runs

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/schemas"
)

// endAttempt is a transition that ends attempt 1 once: it records the
// attempt's end on the Run and emits the attempt_ended event carrying its
// record beside a phase event, as the lifecycle's settling does.
type endAttempt struct{ held, ended time.Time }

func (t endAttempt) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.CostUSD > 0 {
		return r, nil, lifecycle.ErrNoChange
	}
	rec := schemas.AttemptRecord{Attempt: 1, NodeID: "n1", GPUs: 2, GPUModel: "H100", PricePerHour: 4,
		HeldFrom: &t.held, EndedAt: &t.ended, Outcome: "succeeded", CostUSD: 6}
	r.Attempts, r.CostUSD = []schemas.AttemptRecord{rec}, rec.CostUSD
	return r, []schemas.RunEvent{
		{Type: schemas.EventPhase, Phase: r.Phase, Message: "noted"},
		{Type: schemas.EventAttemptEnded, Attempt: 1, NodeID: "n1", Usage: &rec},
	}, nil
}

// usageRecords reads every record WF_USAGE holds.
func (e *storeEnv) usageRecords(t *testing.T) []schemas.UsageRecord {
	t.Helper()
	stream, err := e.conn.JS.Stream(e.ctx, bus.StreamUsage)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []schemas.UsageRecord
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(e.ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var rec schemas.UsageRecord
		if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &rec); err != nil {
			t.Fatal(err)
		}
		if m.Subject != bus.UsageSubject(rec.Tenant) || m.Header.Get(jetstream.MsgIDHeader) != bus.UsageMsgID(rec.AttemptID) {
			t.Errorf("record on %s with id %q", m.Subject, m.Header.Get(jetstream.MsgIDHeader))
		}
		out = append(out, rec)
	}
	return out
}

// An ended attempt's event goes out as a usage record on its tenant's
// wf.usage subject too, once however often the outbox is published; a
// record that could not be stored holds back its event, so the pass's
// repair publishes both.
func TestAttemptEndedPublishesUsage(t *testing.T) {
	e := newStoreEnv(t)
	held := e.now.Add(-90 * time.Minute)
	ended := e.now.Add(-time.Minute)
	r := e.create(t, "usage")
	if _, err := e.store.Advance(e.ctx, r.ID, endAttempt{held, ended}, false); err != nil {
		t.Fatal(err)
	}
	want := schemas.UsageRecord{RunID: r.ID, Tenant: schemas.DefaultTenant, AttemptID: schemas.WorkloadID(r.ID, 1), NodeID: "n1",
		GPUModel: "H100", GPUs: 2, HeldFrom: held, EndedAt: ended, Seconds: 89 * 60, CostUSD: 6, Outcome: "succeeded"}
	recs := e.usageRecords(t)
	if len(recs) != 1 || recs[0] != want {
		t.Fatalf("usage records %+v, want %+v", recs, want)
	}
	// Redelivered: the outbox goes out again; WF_USAGE dedupes it.
	if _, err := e.store.Advance(e.ctx, r.ID, endAttempt{held, ended}, true); !errors.Is(err, lifecycle.ErrNoChange) {
		t.Fatalf("redelivered: %v", err)
	}
	if recs := e.usageRecords(t); len(recs) != 1 {
		t.Fatalf("after a republish WF_USAGE holds %d records, want 1", len(recs))
	}
	if got := seqs(e.events(t, r.ID)); !sameSeqs(got, 1, 2, 3) {
		t.Fatalf("events %v, want 1-3", got)
	}

	// WF_USAGE away: the write stands, neither its record nor its events
	// go out, and the repair publishes them all.
	r2 := e.create(t, "usage-repair")
	e.withoutStream(t, bus.StreamUsage, func() {
		if _, err := e.store.Advance(e.ctx, r2.ID, endAttempt{held, ended}, false); err == nil {
			t.Fatal("the publish did not fail")
		}
	})
	if got := seqs(e.events(t, r2.ID)); !sameSeqs(got, 1) {
		t.Fatalf("events %v stored while the usage record was not, want only the accepted one", got)
	}
	stored, _, err := e.store.Stored(e.ctx, r2.ID)
	if err != nil {
		t.Fatal(err)
	}
	e.store.RepairOutboxes(e.ctx, []*schemas.Run{&stored})
	if got := seqs(e.events(t, r2.ID)); !sameSeqs(got, 1, 2, 3) {
		t.Fatalf("events %v after the repair, want 1-3", got)
	}
	if recs := e.usageRecords(t); len(recs) != 2 || recs[1].RunID != r2.ID {
		t.Fatalf("usage records after the repair: %+v", recs)
	}
}

// Only an attempt_ended event with its record is a usage record; one
// never held costs nothing and lasted no time.
func TestUsageOf(t *testing.T) {
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	if _, ok := UsageOf("acme", schemas.RunEvent{Type: schemas.EventPhase, Usage: &schemas.AttemptRecord{}}); ok {
		t.Error("a phase event made a usage record")
	}
	if _, ok := UsageOf("acme", schemas.RunEvent{Type: schemas.EventAttemptEnded}); ok {
		t.Error("an attempt_ended event without its record made one")
	}
	rec, ok := UsageOf("acme", schemas.RunEvent{RunID: "r-1", Type: schemas.EventAttemptEnded, At: at, Usage: &schemas.AttemptRecord{Attempt: 2, NodeID: "n2", PricePerHour: 3}})
	if !ok || rec.AttemptID != "r-1-a2" || rec.Seconds != 0 || rec.CostUSD != 0 || !rec.EndedAt.Equal(at) || rec.Tenant != "acme" {
		t.Errorf("never held: %+v", rec)
	}
}
