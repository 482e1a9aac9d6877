package runs

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/schemas"
)

// newRetentionEnv is a store env whose clock starts now, as the stream's
// timestamps do, with a retention of keep over its store.
func newRetentionEnv(t *testing.T, keep time.Duration) (*storeEnv, *Retention) {
	t.Helper()
	e := newStoreEnv(t)
	e.now = time.Now()
	ret, err := NewRetention(e.store, RetentionConfig{Keep: keep})
	if err != nil {
		t.Fatal(err)
	}
	return e, ret
}

// end creates a Run and cancels it before placement: an ended Run.
func (e *storeEnv) end(t *testing.T, requestID string) schemas.Run {
	t.Helper()
	r := e.create(t, requestID)
	ended, err := e.store.Advance(e.ctx, r.ID, lifecycle.Cancellation{Reason: "test"}, false)
	if err != nil || !ended.Phase.Terminal() {
		t.Fatalf("end %s: %s, %v", requestID, ended.Phase, err)
	}
	return ended
}

func (e *storeEnv) stored(t *testing.T, id string) bool {
	t.Helper()
	_, found, err := e.store.Stored(e.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func TestRetentionRefusesNoKeep(t *testing.T) {
	for _, keep := range []time.Duration{0, -time.Hour} {
		if _, err := NewRetention(nil, RetentionConfig{Keep: keep}); err == nil {
			t.Errorf("retention %s accepted", keep)
		}
	}
}

// An ended Run past its retention is purged, by one replica; an ended Run
// within it and an active Run stay; the purge leaves no value behind.
func TestRetentionRemovesEndedRunsPastIt(t *testing.T) {
	e, ret := newRetentionEnv(t, 30*time.Minute)
	old := e.end(t, "old")
	active := e.create(t, "active")
	e.now = e.now.Add(time.Hour)
	recent := e.end(t, "recent")
	e.now = e.now.Add(20 * time.Minute)

	n, err := ret.Sweep(e.ctx)
	if err != nil || n != 1 {
		t.Fatalf("sweep removed %d, %v; want the old Run", n, err)
	}
	if e.stored(t, old.ID) || !e.stored(t, active.ID) || !e.stored(t, recent.ID) {
		t.Fatalf("after the sweep: old %v, active %v, recent %v; want only old gone",
			e.stored(t, old.ID), e.stored(t, active.ID), e.stored(t, recent.ID))
	}
	if _, err := e.kv.Get(e.ctx, old.ID); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("get of the purged Run: %v, want not found", err)
	}
	other, _ := e.replica()
	otherRet, err := NewRetention(other, RetentionConfig{Keep: 30 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := otherRet.Sweep(e.ctx); err != nil || n != 0 {
		t.Fatalf("a second replica's sweep removed %d, %v; want nothing left to remove", n, err)
	}
	if ret.Removed() != 1 {
		t.Errorf("removed counter %d, want 1", ret.Removed())
	}
}

// A write after the sweep read a Run wins: the purge at the read revision
// fails and the Run stays.
func TestRetentionLeavesARunChangedSince(t *testing.T) {
	e, ret := newRetentionEnv(t, time.Minute)
	r := e.end(t, "changed")
	e.now = e.now.Add(2 * time.Minute)
	due, err := ret.expired(e.ctx, e.now.Add(-time.Minute))
	if err != nil || len(due) != 1 || due[0].id != r.ID {
		t.Fatalf("due = %+v, %v; want the ended Run", due, err)
	}
	entry, err := e.kv.Get(e.ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.kv.Update(e.ctx, r.ID, entry.Value(), entry.Revision()); err != nil {
		t.Fatal(err)
	}
	events, err := e.conn.JS.Stream(e.ctx, "WF_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	if ret.remove(e.ctx, events, due[0]) {
		t.Fatal("purged a Run written after the sweep read it")
	}
	if !e.stored(t, r.ID) {
		t.Fatal("the Run changed since the read is gone")
	}
}

// A Run whose outbox WF_EVENTS does not hold is not removed while its
// publish fails (it is marked for the repair); a sweep that can publish it
// publishes it first, then removes the Run.
func TestRetentionPublishesAnOutboxFirst(t *testing.T) {
	e, ret := newRetentionEnv(t, time.Minute)
	r := e.create(t, "unpublished")
	e.withoutEvents(t, func() {
		if _, err := e.store.Advance(e.ctx, r.ID, lifecycle.Cancellation{Reason: "test"}, false); err == nil {
			t.Fatal("the end's publish did not fail")
		}
	})
	// Forget the writer's mark: the sweep must find the gap on its own.
	e.store.repair.take()
	e.now = e.now.Add(2 * time.Minute)
	e.withoutEvents(t, func() {
		if n, err := ret.Sweep(e.ctx); err != nil || n != 0 {
			t.Fatalf("sweep removed %d, %v; want the Run kept", n, err)
		}
	})
	if !e.stored(t, r.ID) {
		t.Fatal("a Run whose outbox could not be published was removed")
	}
	if marked, _ := e.store.repair.take(); len(marked) != 1 {
		t.Fatalf("marked for repair: %v, want the Run", marked)
	}
	if evs := e.events(t, r.ID); len(evs) != 1 {
		t.Fatalf("WF_EVENTS holds %v before the sweep can publish, want the accepted event alone", seqs(evs))
	}
	if n, err := ret.Sweep(e.ctx); err != nil || n != 1 {
		t.Fatalf("sweep removed %d, %v; want the Run", n, err)
	}
	if evs := e.events(t, r.ID); len(evs) == 0 || !evs[len(evs)-1].Phase.Terminal() {
		t.Fatalf("WF_EVENTS holds %v after the Run was removed, want its end", seqs(evs))
	}
}
