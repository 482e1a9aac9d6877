package runs

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

func TestEventSeqOf(t *testing.T) {
	for _, tc := range []struct {
		msgID, runID string
		want         uint64
	}{
		{"r-1:3", "r-1", 3},
		{"r-1:0", "r-1", 0},
		{"r-10:3", "r-1", 0}, // another Run whose id begins the same
		{"r-1:x", "r-1", 0},
		{"rejected-submit-7", "r-1", 0}, // a rejection's id
		{"", "r-1", 0},
	} {
		if got := eventSeqOf(tc.msgID, tc.runID); got != tc.want {
			t.Errorf("eventSeqOf(%q, %q) = %d, want %d", tc.msgID, tc.runID, got, tc.want)
		}
	}
}

// Only a decision that leaves the Run accepted with no node (a wait) is
// folded into the accepted event.
func TestFoldDecision(t *testing.T) {
	d := &schemas.BookingDecision{RunID: "r-1"}
	wait := schemas.RunEvent{Type: schemas.EventDecided, Phase: schemas.PhaseAccepted, Code: schemas.CodeNoCapacity, Message: "waiting", Decision: d}
	booked := schemas.RunEvent{Type: schemas.EventDecided, Phase: schemas.PhaseAccepted, NodeID: "n1", Decision: d}
	phase := schemas.RunEvent{Type: schemas.EventPhase, Phase: schemas.PhasePlaced}
	for _, tc := range []struct {
		name   string
		evs    []schemas.RunEvent
		folded bool
		left   int
	}{
		{"a wait", []schemas.RunEvent{wait}, true, 0},
		{"a booking", []schemas.RunEvent{booked, phase}, false, 2},
		{"a phase", []schemas.RunEvent{phase}, false, 1},
		{"nothing", nil, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			accepted := schemas.RunEvent{Type: schemas.EventAccepted, Phase: schemas.PhaseAccepted}
			left := foldDecision(&accepted, tc.evs)
			if len(left) != tc.left || (accepted.Decision != nil) != tc.folded {
				t.Fatalf("left %d events (want %d), decision folded %v (want %v)", len(left), tc.left, accepted.Decision != nil, tc.folded)
			}
			if tc.folded && (accepted.Code != wait.Code || accepted.Message != wait.Message) {
				t.Errorf("the accepted event carries %s %q, want the wait's", accepted.Code, accepted.Message)
			}
		})
	}
}

// storeEnv is a Store over an embedded, provisioned NATS, its clock fixed.
type storeEnv struct {
	conn   *bus.Conn
	kv     jetstream.KeyValue
	ctx    context.Context
	now    time.Time
	pokes  atomic.Int64
	store  *Store
	cached *cache.Cache
}

func newStoreEnv(t *testing.T) *storeEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	e := &storeEnv{conn: testenv.ProvisionedBus(t, "runs-test"), ctx: ctx, now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	kv, err := e.conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	e.kv = kv
	e.store, e.cached = e.replica()
	return e
}

// replica is another Store over the same buckets, with its own cache.
func (e *storeEnv) replica() (*Store, *cache.Cache) {
	c := cache.New()
	cfg := Config{DecisionCandidates: 8, MaxAttempts: 2, Poke: func() { e.pokes.Add(1) }, Now: func() time.Time { return e.now }}
	return NewStore(e.kv, e.conn.JS, c, cfg, zap.NewNop()), c
}

func (e *storeEnv) create(t *testing.T, requestID string) schemas.Run {
	t.Helper()
	r, existed, err := e.store.Create(e.ctx, schemas.DefaultTenant, bus.OperatorUser, schemas.RunRequest{RequestID: requestID}, nil, Policy{}, func(schemas.Run) lifecycle.Transition { return nil })
	if err != nil || existed {
		t.Fatalf("create %s: existed %v, %v", requestID, existed, err)
	}
	return r
}

// events reads the Run's events as WF_EVENTS holds them, in order.
func (e *storeEnv) events(t *testing.T, runID string) []schemas.RunEvent {
	t.Helper()
	stream, err := e.conn.JS.Stream(e.ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	var evs []schemas.RunEvent
	for seq := uint64(1); seq <= stream.CachedInfo().State.LastSeq; seq++ {
		m, err := stream.GetMsg(e.ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != bus.RunEventsSubject(schemas.DefaultTenant, runID) {
			continue
		}
		var ev schemas.RunEvent
		if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func seqs(evs []schemas.RunEvent) []uint64 {
	var s []uint64
	for _, ev := range evs {
		s = append(s, ev.Seq)
	}
	return s
}

func sameSeqs(a []uint64, b ...uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// withoutEvents runs fn while WF_EVENTS captures no Run event, so every
// publish of one fails, as when the stream is unavailable.
func (e *storeEnv) withoutEvents(t *testing.T, fn func()) {
	e.withoutStream(t, bus.StreamEvents, fn)
}

// withoutStream runs fn while stream captures nothing.
func (e *storeEnv) withoutStream(t *testing.T, name string, fn func()) {
	t.Helper()
	stream, err := e.conn.JS.Stream(e.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	broken := cfg
	broken.Subjects = []string{"wf.unused.>"}
	if _, err := e.conn.JS.UpdateStream(e.ctx, broken); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// A failed publish is retried a moment later: the window lasts
		// until every publish sent in it has had its last answer.
		select {
		case <-e.conn.JS.PublishAsyncComplete():
		case <-e.ctx.Done():
			t.Fatal("publishes still pending")
		}
		if _, err := e.conn.JS.UpdateStream(e.ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}()
	fn()
}

// Two replicas write one Run: the one whose cached copy is stale loses the
// CAS, reads the Run again and applies its transition to what the other
// wrote, numbering its events after the other's.
func TestAdvanceAfterACASConflict(t *testing.T) {
	e := newStoreEnv(t)
	r := e.create(t, "cas")
	other, _ := e.replica()
	if _, err := other.Advance(e.ctx, r.ID, lifecycle.NoNodeFits(schemas.BookingDecision{RunID: r.ID}, ""), false); err != nil {
		t.Fatal(err)
	}
	// e.store's cache still holds the Run as created.
	if cached, _ := e.cached.Run(r.ID); cached.Waiting != "" {
		t.Fatalf("the first replica's cache already saw the other's write: %+v", cached)
	}
	pokes := e.pokes.Load()
	got, err := e.store.Advance(e.ctx, r.ID, lifecycle.Cancellation{Reason: "user"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got.Phase != schemas.PhaseCancelled || got.Waiting != "no nodes enrolled" || got.EventSeq != 4 {
		t.Fatalf("after the conflict: phase %s, waiting %q, event seq %d; want cancelled over the other's wait, seq 4", got.Phase, got.Waiting, got.EventSeq)
	}
	stored, found, err := e.store.Stored(e.ctx, r.ID)
	if err != nil || !found || stored.Phase != schemas.PhaseCancelled || stored.Waiting != got.Waiting {
		t.Fatalf("stored: %+v %v %v", stored, found, err)
	}
	if cached, ok := e.cached.Run(r.ID); ok {
		t.Errorf("the writer's cache still holds the Run it ended: %s", cached.Phase)
	}
	if evs := e.events(t, r.ID); !sameSeqs(seqs(evs), 1, 2, 3, 4) || evs[3].Phase != schemas.PhaseCancelled {
		t.Errorf("events %v, want 1-4 ending cancelled", seqs(evs))
	}
	if e.pokes.Load() != pokes+1 {
		t.Errorf("a Run that ended did not poke the scheduler")
	}
	// A stale copy never decides that nothing needs doing, nor the
	// reverse: the other replica's cache still shows the Run waiting.
	if _, err := other.Advance(e.ctx, r.ID, lifecycle.Cancellation{Reason: "again"}, false); !errors.Is(err, lifecycle.ErrNoChange) {
		t.Errorf("cancelling a cancelled Run from a stale copy: %v", err)
	}
}

// A write whose publish failed is repaired two ways: the redelivered
// message publishes the Run's outbox again, and the next pass's repair
// publishes what WF_EVENTS lacks; neither stores an event twice.
func TestOutboxRepublished(t *testing.T) {
	e := newStoreEnv(t)
	r := e.create(t, "outbox")
	wait := lifecycle.NoNodeFits(schemas.BookingDecision{RunID: r.ID}, "")
	e.withoutEvents(t, func() {
		if _, err := e.store.Advance(e.ctx, r.ID, wait, false); err == nil {
			t.Fatal("the publish did not fail")
		}
	})
	stored, _, err := e.store.Stored(e.ctx, r.ID)
	if err != nil || stored.Waiting == "" || stored.EventSeq != 2 || len(stored.Outbox) != 1 {
		t.Fatalf("the write must stand with its event in the outbox: %+v %v", stored, err)
	}
	if got := seqs(e.events(t, r.ID)); !sameSeqs(got, 1) {
		t.Fatalf("events %v before any repair, want only the accepted one", got)
	}
	// Not redelivered: nothing to do, nothing published.
	sent := e.store.EventsPublished()
	if _, err := e.store.Advance(e.ctx, r.ID, wait, false); !errors.Is(err, lifecycle.ErrNoChange) || e.store.EventsPublished() != sent {
		t.Fatalf("a first delivery that finds nothing to do published (%v)", err)
	}
	// Redelivered, on another replica: the outbox goes out again.
	other, _ := e.replica()
	if _, err := other.Advance(e.ctx, r.ID, wait, true); !errors.Is(err, lifecycle.ErrNoChange) {
		t.Fatalf("redelivered: %v", err)
	}
	if got := seqs(e.events(t, r.ID)); !sameSeqs(got, 1, 2) {
		t.Fatalf("events %v after the redelivery, want 1, 2", got)
	}
	// The pass's repair finds the Run marked and WF_EVENTS complete: it
	// publishes nothing, and clears the mark.
	active := []*schemas.Run{&stored}
	sent = e.store.EventsPublished()
	e.store.RepairOutboxes(e.ctx, active)
	e.store.RepairOutboxes(e.ctx, active)
	if e.store.EventsPublished() != sent {
		t.Errorf("repair published %d events WF_EVENTS already held", e.store.EventsPublished()-sent)
	}
	if got := seqs(e.events(t, r.ID)); !sameSeqs(got, 1, 2) {
		t.Errorf("events %v after the repair, want 1, 2", got)
	}
}

// The scheduling pass's repair publishes, for a Run whose publish failed,
// only the events after the last one WF_EVENTS holds, then forgets it.
func TestRepairOutboxesPublishesWhatIsMissing(t *testing.T) {
	e := newStoreEnv(t)
	r := e.create(t, "repair")
	e.withoutEvents(t, func() {
		if _, err := e.store.Advance(e.ctx, r.ID, lifecycle.Cancellation{Reason: "user"}, false); err == nil {
			t.Fatal("the publish did not fail")
		}
	})
	stored, _, _ := e.store.Stored(e.ctx, r.ID)
	if len(stored.Outbox) != 2 {
		t.Fatalf("outbox %+v, want the cancel and its phase", stored.Outbox)
	}
	// A repair while WF_EVENTS is still away fails and keeps the mark.
	e.withoutEvents(t, func() { e.store.RepairOutboxes(e.ctx, nil) })
	sent := e.store.EventsPublished()
	e.store.RepairOutboxes(e.ctx, nil) // the Run ended: repaired from the cache
	if got := seqs(e.events(t, r.ID)); !sameSeqs(got, 1, 2, 3) {
		t.Fatalf("events %v after the repair, want 1, 2, 3", got)
	}
	if n := e.store.EventsPublished() - sent; n != 2 {
		t.Errorf("repair published %d events, want the 2 WF_EVENTS lacked", n)
	}
	sent = e.store.EventsPublished()
	e.store.RepairOutboxes(e.ctx, nil)
	if e.store.EventsPublished() != sent {
		t.Errorf("a repaired Run was repaired again")
	}
}

// A submit seen twice creates the Run once; an early decision that leaves
// it waiting rides in its accepted event; the retry policy is the Run's
// before its first decision.
func TestCreate(t *testing.T) {
	e := newStoreEnv(t)
	req := schemas.RunRequest{RequestID: "twice"}
	retry := &schemas.RetryPolicy{On: []schemas.RetryEvent{schemas.RetryOOM}, MaxAttempts: 2}
	var decidedWith *schemas.RetryPolicy
	first := func(r schemas.Run) lifecycle.Transition {
		decidedWith = r.Retry
		return lifecycle.NoNodeFits(schemas.BookingDecision{RunID: r.ID}, "")
	}
	r, existed, err := e.store.Create(e.ctx, schemas.DefaultTenant, bus.OperatorUser, req, nil, Policy{Retry: retry}, first)
	if err != nil || existed {
		t.Fatalf("create: existed %v, %v", existed, err)
	}
	if decidedWith != retry || r.Retry != retry {
		t.Fatalf("retry policy: decided with %v, stored %v; want %v", decidedWith, r.Retry, retry)
	}
	if r.Waiting != "no nodes enrolled" || len(r.Outbox) != 1 || r.Outbox[0].Decision == nil || r.Outbox[0].Code != schemas.CodeNoCapacity {
		t.Fatalf("the wait is not folded into the accepted event: %+v", r)
	}
	again, existed, err := e.store.Create(e.ctx, schemas.DefaultTenant, bus.OperatorUser, req, nil, Policy{}, func(schemas.Run) lifecycle.Transition { return lifecycle.Cancellation{} })
	if err != nil || !existed || again.Phase != schemas.PhaseAccepted || again.EventSeq != 1 {
		t.Fatalf("second create: existed %v, %+v, %v", existed, again, err)
	}
	if got := seqs(e.events(t, r.ID)); !sameSeqs(got, 1) {
		t.Errorf("events %v, want the one accepted event", got)
	}
}

// LoseAttempts ends booked attempts and leaves waiting Runs alone; a Run
// lost more often than MaxAttempts ends lost.
func TestLoseAttempts(t *testing.T) {
	e := newStoreEnv(t)
	book := func(r schemas.Run) *schemas.Run {
		t.Helper()
		got, err := e.store.Advance(e.ctx, r.ID, lifecycle.Placement{NodeID: "n1", FencingToken: 1, Generation: 1}, false)
		if err != nil {
			t.Fatal(err)
		}
		return &got
	}
	waiting := e.create(t, "waiting")
	placed := book(e.create(t, "placed"))
	why := func(node string) string { return "node " + node + " is gone" }
	if !e.store.LoseAttempts(e.ctx, []*schemas.Run{&waiting, placed}, schemas.CodeNodeLost, why) {
		t.Fatal("no Run moved")
	}
	w, _, _ := e.store.Stored(e.ctx, waiting.ID)
	p, _, _ := e.store.Stored(e.ctx, placed.ID)
	if w.EventSeq != waiting.EventSeq {
		t.Errorf("a waiting Run was written: %+v", w)
	}
	if p.Phase != schemas.PhaseAccepted || p.NodeID != "" || p.Reason != string(schemas.CodeNodeLost) {
		t.Fatalf("lost once: %+v", p)
	}
	p2 := book(p)
	if !e.store.LoseAttempts(e.ctx, []*schemas.Run{p2}, schemas.CodeNodeLost, why) {
		t.Fatal("the second loss moved nothing")
	}
	if p, _, _ = e.store.Stored(e.ctx, placed.ID); p.Phase != schemas.PhaseLost {
		t.Errorf("lost on %d nodes with MaxAttempts 2: phase %s", p.Attempt, p.Phase)
	}
	if e.store.LoseAttempts(e.ctx, []*schemas.Run{p2}, schemas.CodeNodeLost, why) {
		t.Error("losing an attempt already lost moved a Run")
	}
}

// Events published together can fail singly: here the cancel (seq 2) is
// lost while its phase (seq 3) is stored. The repair finds the hole below
// the last stored event and fills it, storing nothing twice.
func TestRepairOutboxesFillsAGap(t *testing.T) {
	e := newStoreEnv(t)
	r := e.create(t, "gap")
	e.withoutEvents(t, func() {
		if _, err := e.store.Advance(e.ctx, r.ID, lifecycle.Cancellation{Reason: "user"}, false); err == nil {
			t.Fatal("the publish did not fail")
		}
	})
	stored, _, _ := e.store.Stored(e.ctx, r.ID)
	if len(stored.Outbox) != 2 || stored.Outbox[1].Seq != 3 {
		t.Fatalf("outbox %+v, want seqs 2 and 3", stored.Outbox)
	}
	if err := e.store.PublishEvent(e.ctx, schemas.DefaultTenant, stored.Outbox[1], eventMsgID(stored.Outbox[1])); err != nil {
		t.Fatal(err)
	}
	if got := seqs(e.events(t, r.ID)); !sameSeqs(got, 1, 3) {
		t.Fatalf("events %v before the repair, want the gap 1, 3", got)
	}
	sent := e.store.EventsPublished()
	e.store.RepairOutboxes(e.ctx, nil)
	got := seqs(e.events(t, r.ID))
	slices.Sort(got)
	if !sameSeqs(got, 1, 2, 3) {
		t.Fatalf("events %v after the repair, want 1, 2, 3 once each", got)
	}
	if n := e.store.EventsPublished() - sent; n != 1 {
		t.Errorf("repair published %d events, want the 1 WF_EVENTS lacked", n)
	}
}
