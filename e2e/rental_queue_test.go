package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_RentBeatsQueue: the only node that fits is busy for about
// a minute; a fresh machine is ready in seconds and pulls the image in
// about ten, so the control plane rents one rather than queueing the Run,
// records why (with the numbers, and every busy node marked with the
// reason it lost), and the Run finishes on the rental while the busy node
// still runs its work.
func TestAcceptance_RentBeatsQueue(t *testing.T) {
	w := newWorld(t)
	f, _ := newQueueOrRentFleet(t, 5*time.Second)
	busy := f.startAgent(agentSpec{id: "busy-1", world: w})
	cpu := f.nodeRecord(busy.spec.id).Capacity.CPUMillis
	if cpu <= 0 {
		t.Fatalf("node capacity %d", cpu)
	}
	// It runs on well past the rental's start however slowly this machine
	// starts one; MaxRuntimeSeconds is what the queue estimate reads.
	long := f.submit(schemas.RunRequest{RequestID: "busy-long", Image: w.image.Reference, Command: []string{"sleep", "55"},
		Resources: schemas.Resources{CPUMillis: cpu}, MaxRuntimeSeconds: 60})
	f.waitPhase(long, schemas.PhaseRunning, 60*time.Second)
	if n := len(f.rentals()); n != 0 {
		t.Fatalf("%d rentals while the node was free", n)
	}

	next := f.submit(schemas.RunRequest{RequestID: "rent-not-queue", Image: w.image.Reference, Command: []string{"true"},
		Resources: schemas.Resources{CPUMillis: cpu}})
	r := f.waitPhase(next, schemas.PhaseSucceeded, 60*time.Second)
	if r.NodeID == busy.spec.id {
		t.Fatalf("the Run queued on the busy node instead of renting")
	}
	rs := f.rentals()
	if len(rs) != 1 || rs[0].NodeID != r.NodeID || rs[0].ForRun != next {
		t.Fatalf("rentals %+v; run ran on %s", rs, r.NodeID)
	}
	if lr, _ := f.run(long); lr.Phase != schemas.PhaseRunning {
		t.Fatalf("the busy node's Run is %s; the rental was not sooner", lr.Phase)
	}
	var decided *schemas.RunEvent
	for _, ev := range f.events(next) {
		if ev.Decided() && ev.Code == schemas.CodeRentBeatsQueue {
			decided = &ev
			break
		}
	}
	if decided == nil || decided.Decision == nil || decided.Decision.Winner != "" || decided.Message == "" {
		t.Fatalf("no recorded decision to rent rather than queue: %+v", decided)
	}
	for _, c := range decided.Decision.Candidates {
		if c.NodeID == busy.spec.id && (c.Reason != schemas.CodeRentBeatsQueue || c.Components.QueueSeconds <= 0) {
			t.Fatalf("the busy node's candidate in the decision: %+v", c)
		}
	}
	t.Logf("decision: %s", decided.Message)
}

// TestAcceptance_QueueBeatsRent: the same busy node, but a fresh machine
// would not start the Run sooner by the margin, so the Run is booked in the
// busy node's queue and nothing is rented.
func TestAcceptance_QueueBeatsRent(t *testing.T) {
	w := newWorld(t)
	f, provider := newQueueOrRentFleet(t, 5*time.Minute)
	busy := f.startAgent(agentSpec{id: "busy-1", world: w})
	cpu := f.nodeRecord(busy.spec.id).Capacity.CPUMillis
	long := f.submit(schemas.RunRequest{RequestID: "busy-short", Image: w.image.Reference, Command: []string{"sleep", "3"},
		Resources: schemas.Resources{CPUMillis: cpu}, MaxRuntimeSeconds: 60})
	f.waitPhase(long, schemas.PhaseRunning, 60*time.Second)
	next := f.submit(schemas.RunRequest{RequestID: "queue-not-rent", Image: w.image.Reference, Command: []string{"true"},
		Resources: schemas.Resources{CPUMillis: cpu}})
	r := f.waitPhase(next, schemas.PhaseSucceeded, 60*time.Second)
	if r.NodeID != busy.spec.id || provider.Launched() != 0 || len(f.rentals()) != 0 {
		t.Fatalf("run on %s with %d machines rented; want the busy node's queue and no rental", r.NodeID, provider.Launched())
	}
	queued := false
	for _, ev := range f.events(next) {
		if ev.Code == schemas.CodeRentBeatsQueue {
			t.Fatalf("a rent decision was recorded: %+v", ev)
		}
		if ev.Decided() && ev.Decision != nil && ev.Decision.Winner == busy.spec.id && ev.Decision.WinnerQueued {
			queued = true
		}
	}
	if !queued {
		t.Fatal("no decision booked the Run in the busy node's queue")
	}
}

// newQueueOrRentFleet is a fleet whose local provider offers a machine
// ready in seconds; rentMargin is how much sooner a rental must start a Run
// than the busy node's queue for the control plane to rent.
func newQueueOrRentFleet(t *testing.T, rentMargin time.Duration) (*fleet, *local.Provider) {
	var (
		f        *fleet
		provider *local.Provider
	)
	f = newFleet(t, func(c *controlplane.Config) {
		provider = local.New(func(ctx context.Context, name string, boot schemas.NodeBootstrap) (local.Machine, error) {
			return f.localLauncher(t)(ctx, name, boot)
		}, capacity.Offer{ID: "local-fresh", CPUMillis: 1 << 20, MemoryBytes: 1 << 40, ReadySeconds: 2,
			PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: 50_000, Exact: true}})
		c.Capacity = &rentals.Config{Provider: provider, OwnershipToken: "wf-e2e", RentMargin: rentMargin,
			IdleTimeout: time.Minute, Interval: 200 * time.Millisecond}
	})
	return f, provider
}
