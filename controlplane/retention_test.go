package controlplane_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_RetentionBounded: with a 2s retention, 20,000 ended Runs
// leave the control plane's memory while wf_runs still holds them, then
// leave wf_runs (their purge markers expire too); WF_EVENTS drops their
// events at its max age, and the process's heap after GC returns to what
// it was before the Runs were written.
//
// The Runs are written by a second replica's runs.Store, the path intake
// takes (Create, with the decision intake takes when no node can ever run
// a request: each Run ends failed in one write, its accepted and failed
// events published). The control plane under test sees them only through
// its wf_runs watch, as it sees Runs written by any replica, and removes
// them with its own retention. Running 20,000 containers would test the
// agents, not this.
func TestAcceptance_RetentionBounded(t *testing.T) {
	const total = 20_000
	const retention, eventsMaxAge = 2 * time.Second, 8 * time.Second
	pl := startTestPlane(t, controlplane.Config{WaitForCapacity: true, ReconcileInterval: 200 * time.Millisecond, RunRetention: retention, RetentionInterval: 500 * time.Millisecond,
		Topology: bus.Topology{EventsMaxAge: eventsMaxAge, RunsPurgeMarkerTTL: time.Second}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := settledHeap()
	start := time.Now()

	written := writeEndedRuns(t, ctx, pl, total)
	t.Logf("%d ended Runs written in %s; heap after GC %s → %s", total, written, mib(base), mib(settledHeap()))

	runsStream, err := pl.conn.JS.Stream(ctx, "KV_"+bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	events, err := pl.conn.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	msgs := func(s jetstream.Stream) uint64 {
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	// While wf_runs still holds ended Runs (the last 2s of them at least,
	// one of the last written among them), the control plane holds none:
	// they left its memory when they ended.
	runsKV, err := pl.conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	last := schemas.RunIDFor(schemas.DefaultTenant, fmt.Sprintf("retained-%d", total))
	eventually(t, 10*time.Second, "the control plane to hold none of the ended Runs wf_runs holds", func() bool {
		cached := pl.cp.Metrics().CachedRuns
		if _, err := runsKV.Get(ctx, last); err != nil {
			t.Fatalf("the Runs left wf_runs (a read of one written last: %v) before the control plane was seen holding none of them (%d now)", err, cached)
		}
		return cached == 0
	})
	eventually(t, 60*time.Second, "every ended Run and its purge marker gone from wf_runs", func() bool {
		return msgs(runsStream) == 0
	})
	t.Logf("wf_runs empty %s after the last write", time.Since(start)-written)
	if m := pl.cp.Metrics(); m.RunsRemoved != total || m.CachedRuns != 0 {
		t.Fatalf("the control plane removed %d Runs (want %d) and holds %d in memory (want 0)", m.RunsRemoved, total, m.CachedRuns)
	}
	eventually(t, 2*eventsMaxAge, "WF_EVENTS to drop the Runs' events at its max age", func() bool {
		return msgs(events) == 0
	})
	t.Logf("WF_EVENTS empty %s after the last write", time.Since(start)-written)
	after := settledHeap()
	t.Logf("heap after GC: %s before the Runs, %s after they left", mib(base), mib(after))
	if after > base+heapTolerance {
		t.Fatalf("heap after the Runs left is %s, %s over the %s before them (tolerance %s)",
			mib(after), mib(after-base), mib(base), mib(heapTolerance))
	}
}

// heapTolerance is how far above its baseline the heap may settle: far
// below what 20,000 cached Runs (several KiB each) would hold.
const heapTolerance = 8 << 20

// settledHeap is the live heap after the garbage collector ran.
func settledHeap() uint64 {
	var m runtime.MemStats
	for range 3 {
		runtime.GC()
		debug.FreeOSMemory()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// writeEndedRuns writes n Runs that fail at intake through another
// replica's store, its cache following wf_runs as a replica's does, and
// returns how long that took. The replica is stopped before it returns.
func writeEndedRuns(t *testing.T, ctx context.Context, pl *testPlane, n int) time.Duration {
	t.Helper()
	kvs := map[string]jetstream.KeyValue{}
	for _, b := range []string{bus.BucketRuns, bus.BucketNodes, bus.BucketResidency} {
		kv, err := pl.conn.JS.KeyValue(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		kvs[b] = kv
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	c := cache.New()
	if err := c.Start(wctx, &wg, kvs[bus.BucketRuns], kvs[bus.BucketNodes], kvs[bus.BucketResidency], zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	store := runs.NewStore(kvs[bus.BucketRuns], pl.conn.JS, c, runs.Config{DecisionCandidates: 8, MaxAttempts: 3, Poke: func() {}, Now: time.Now}, zap.NewNop())
	failAtIntake := func(r schemas.Run) lifecycle.Transition {
		return lifecycle.Unsatisfiable{Decision: schemas.BookingDecision{RunID: r.ID}, Summary: "no node can run it"}
	}
	start := time.Now()
	var next atomic.Int64
	var failed atomic.Value
	var writers sync.WaitGroup
	for range 16 {
		writers.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				r, dup, err := store.Create(wctx, schemas.DefaultTenant, bus.OperatorUser, testRequest(fmt.Sprintf("retained-%d", i)), nil, runs.Policy{}, failAtIntake)
				if err != nil || dup || r.Phase != schemas.PhaseFailed {
					failed.CompareAndSwap(nil, fmt.Sprintf("run %d: %s, duplicate %v, %v", i, r.Phase, dup, err))
					return
				}
			}
		})
	}
	writers.Wait()
	if f := failed.Load(); f != nil {
		t.Fatal(f)
	}
	return time.Since(start)
}
