package metrics_test

import (
	"context"
	"encoding/json"
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/metrics"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

func TestRunPhasesFollowsBucket(t *testing.T) {
	n := testenv.StartNATS(t)
	conn, err := bus.Connect(n.URL(), "metrics-test", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := conn.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bus.BucketRuns, History: 5})
	if err != nil {
		t.Fatal(err)
	}
	put := func(id string, phase schemas.Phase) {
		t.Helper()
		b, err := json.Marshal(schemas.Run{ID: id, Phase: phase})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, id, b); err != nil {
			t.Fatal(err)
		}
	}
	// Runs that exist before the watch starts, one of them updated twice.
	put("r-1", schemas.PhaseAccepted)
	put("r-1", schemas.PhaseRunning)
	put("r-2", schemas.PhaseSucceeded)
	put("r-3", schemas.PhaseSucceeded)
	if _, err := kv.Put(ctx, "r-junk", []byte("not json")); err != nil {
		t.Fatal(err)
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	p, err := metrics.WatchRunPhases(wctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	waitCounts := func(want map[schemas.Phase]int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, synced := p.Counts()
			if synced && maps.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("counts %v (synced %v), want %v", got, synced, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitCounts(map[schemas.Phase]int{schemas.PhaseRunning: 1, schemas.PhaseSucceeded: 2})

	put("r-1", schemas.PhaseFailed)
	put("r-4", schemas.PhaseAccepted)
	if err := kv.Delete(ctx, "r-2"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "r-3"); err != nil {
		t.Fatal(err)
	}
	waitCounts(map[schemas.Phase]int{schemas.PhaseFailed: 1, schemas.PhaseAccepted: 1})

	// Counts hands out a copy.
	got, _ := p.Counts()
	got[schemas.PhaseLost] = 99
	waitCounts(map[schemas.Phase]int{schemas.PhaseFailed: 1, schemas.PhaseAccepted: 1})

	// After its context ends the watch stops following the bucket.
	stop()
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("watch still running 10s after its context ended")
	}
	put("r-5", schemas.PhaseAccepted)
	time.Sleep(200 * time.Millisecond)
	if got, _ := p.Counts(); got[schemas.PhaseAccepted] != 1 {
		t.Errorf("watch still following after its context ended: %v", got)
	}
}
