package cache

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// runsFixture is a provisioned wf_runs on its own server, a context for the
// test and an empty cache.
func runsFixture(t *testing.T, name string) (context.Context, jetstream.KeyValue, *Cache) {
	t.Helper()
	conn := testenv.ProvisionedBus(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	kv, err := conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, kv, New()
}

// TestCacheDecodesWatchedRunsLazily: a watched Run is held as raw JSON until
// read; this replica's own note of the same revision replaces it without a
// decode; a value that does not decode is dropped, never acted on; a
// terminal Run keeps no seed.
func TestCacheDecodesWatchedRunsLazily(t *testing.T) {
	ctx, kv, c := runsFixture(t, "cache-test")
	watch := func(key string, v []byte) uint64 {
		t.Helper()
		if _, err := kv.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		c.applyRun(e)
		return e.Revision()
	}
	encode := func(r schemas.Run) []byte {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	a := schemas.Run{ID: "r-a", Phase: schemas.PhaseAccepted, Waiting: "no node"}
	revA := watch(a.ID, encode(a))
	if len(c.undecoded) != 1 {
		t.Fatalf("watched Run decoded at once: %d undecoded, want 1", len(c.undecoded))
	}
	if got, ok := c.Run(a.ID); !ok || got.Waiting != "no node" {
		t.Fatalf("run(%s) = %+v, %v; want the watched Run", a.ID, got, ok)
	}
	if s := c.RunSeed(a.ID); s.Revision != revA || len(s.JSON) == 0 {
		t.Fatalf("seed of an active Run = rev %d, %d bytes; want rev %d with its JSON", s.Revision, len(s.JSON), revA)
	}

	b := schemas.Run{ID: "r-b", Phase: schemas.PhaseAccepted}
	rawB := encode(b)
	revB := watch(b.ID, rawB)
	b.Waiting = "noted" // the writer's copy wins for the same revision
	c.NoteRun(b, revB, rawB)
	if _, left := c.undecoded[b.ID]; left {
		t.Fatal("noted Run still marked undecoded")
	}
	if got, _ := c.Run(b.ID); got.Waiting != "noted" {
		t.Fatalf("noted copy replaced by %+v", got)
	}

	watch("r-bad", []byte(`{"id": 7`))
	d := schemas.Run{ID: "r-done", Phase: schemas.PhaseSucceeded}
	watch(d.ID, encode(d))
	active := c.ActiveRuns()
	if len(active) != 2 {
		t.Fatalf("activeRuns = %d Runs, want r-a and r-b", len(active))
	}
	if _, ok := c.Run("r-bad"); ok {
		t.Fatal("a Run that does not decode is still cached")
	}
	if s := c.RunSeed(d.ID); len(s.JSON) != 0 {
		t.Fatal("terminal Run keeps its seed")
	}
	if len(c.undecoded) != 0 {
		t.Fatalf("%d Runs left undecoded after activeRuns", len(c.undecoded))
	}
	if n := c.RunCount(); n != 2 {
		t.Fatalf("cache holds %d Runs after activeRuns, want the 2 active ones (an ended Run leaves)", n)
	}
}

// TestCacheDropsEndedRuns: a Run that ends leaves the cache whether this
// replica wrote the end or its watch delivered it; an older write the
// watch delivers late, or a late note of one, does not bring it back; the
// phase counts hold active Runs only.
func TestCacheDropsEndedRuns(t *testing.T) {
	ctx, kv, c := runsFixture(t, "cache-ended")
	put := func(r schemas.Run) (jetstream.KeyValueEntry, []byte) {
		t.Helper()
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, r.ID, b); err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		return e, b
	}

	// This replica writes the end; its watch delivers the Run's earlier
	// write, then the end.
	running := schemas.Run{ID: "r-mine", Phase: schemas.PhaseRunning}
	eRunning, rawRunning := put(running)
	c.NoteRun(running, eRunning.Revision(), rawRunning)
	done := running
	done.Phase = schemas.PhaseSucceeded
	eDone, rawDone := put(done)
	c.NoteRun(done, eDone.Revision(), rawDone)
	if _, ok := c.Run(done.ID); ok || c.RunCount() != 0 {
		t.Fatalf("the ended Run is still cached (%d Runs)", c.RunCount())
	}
	c.applyRun(eRunning)
	if n := len(c.ActiveRuns()); n != 0 {
		t.Fatalf("the watch's late delivery of the running write brought the Run back: %d active", n)
	}
	c.applyRun(eDone)
	if len(c.ended) != 0 || c.RunCount() != 0 {
		t.Fatalf("after the watch delivered the end: %d ends remembered, %d Runs cached; want none", len(c.ended), c.RunCount())
	}
	// A late note of the earlier write (its writer was slow) is ignored too.
	c.NoteRun(running, eRunning.Revision(), rawRunning)
	if c.RunCount() != 0 {
		t.Fatal("a late note of an older write brought an ended Run back")
	}

	// Another replica writes the end: the watch delivers it.
	other := schemas.Run{ID: "r-other", Phase: schemas.PhaseAccepted}
	eOther, _ := put(other)
	c.applyRun(eOther)
	waiting := schemas.Run{ID: "r-waiting", Phase: schemas.PhaseAccepted}
	eWaiting, _ := put(waiting)
	c.applyRun(eWaiting)
	other.Phase = schemas.PhaseFailed
	eOtherDone, _ := put(other)
	c.applyRun(eOtherDone)
	if got := c.RunPhases(); len(got) != 1 || got[schemas.PhaseAccepted] != 1 {
		t.Fatalf("phases = %v, want accepted: 1 (ended Runs are not counted)", got)
	}
	if n := c.RunCount(); n != 1 {
		t.Fatalf("cache holds %d Runs, want the waiting one", n)
	}
}
