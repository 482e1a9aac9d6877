package runpodserverless_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
)

// TestPolicyFromTheRun: the Run's max runtime becomes the job's
// executionTimeout and its ttl bounds its time in the queue, both enforced
// on RunPod's side; purge-queue empties an endpoint's queue.
func TestPolicyFromTheRun(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	launch := func(key string, timeout, ttl int64) ephemeral.Ref {
		t.Helper()
		req := ephemeral.LaunchRequest{ConnectionID: "conn-test", LaunchKey: key, RunID: key, Attempt: 1, OwnershipToken: "wf", OfferID: "ep-a100",
			Input: ephemeral.Input{Command: []string{"train"}}, ExecutionTimeoutSeconds: timeout, TTLSeconds: ttl}
		rc, err := w.Launch(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return ephemeral.Ref{ConnectionID: "conn-test", ExecutionID: rc.ExecutionID, OfferID: "ep-a100", OwnershipToken: "wf"}
	}
	state := func(ref ephemeral.Ref) ephemeral.State {
		t.Helper()
		x, err := w.Observe(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		return x.State
	}
	short := launch("short", 5, 3600) // the fake's jobs run 20s
	w.srv.Advance(10 * time.Second)
	if s := state(short); s != ephemeral.StateTimedOut {
		t.Fatalf("a job past its executionTimeout is %s", s)
	}
	w.srv.Workers("ep-a100", 0)
	queued := launch("queued", 600, 30)
	stays := launch("stays", 600, 3600)
	w.srv.Advance(time.Minute)
	if s := state(queued); s != ephemeral.StateTimedOut {
		t.Fatalf("a job queued past its ttl is %s", s)
	}
	if n, err := w.PurgeQueue(ctx, "ep-a100"); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	if s := state(stays); s != ephemeral.StateCancelled {
		t.Fatalf("a purged job is %s", s)
	}
	if _, err := w.Terminate(ctx, stays); !errors.Is(err, capacity.ErrUnsupported) {
		t.Fatalf("terminate: %v", err)
	}
	if w.Support().ListOwned || w.Support().IdempotentLaunch != capacity.IdempotencyNone || !w.Support().ProviderTTL {
		t.Fatalf("support %+v: RunPod serverless lists no jobs and takes no key; its ttl bounds a lost launch", w.Support())
	}
}
