package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/agent/interruption"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/schemas"
)

// spotFleet is a fleet renting local machines from an on-demand offer and
// a cheaper spot one. Each machine's agent watches a notice file in its
// data dir, which notice writes: the node's own interruption signal.
type spotFleet struct {
	*fleet
	provider *local.Provider
	mu       sync.Mutex
	dirs     map[string]string // native ref → the machine's data dir
}

func newSpotFleet(t *testing.T, tune func(*rentals.Config)) *spotFleet {
	sf := &spotFleet{dirs: map[string]string{}}
	usd := func(micros int64) capacity.Price {
		return capacity.Price{Currency: "USD", MicrosPerHour: micros, Exact: true}
	}
	sf.provider = local.New(func(ctx context.Context, name string, boot schemas.NodeBootstrap) (local.Machine, error) {
		return sf.localLauncherWith(t, func(name, dir string, c *agent.Config) {
			sf.mu.Lock()
			sf.dirs[name] = dir
			sf.mu.Unlock()
			c.Interruption = interruption.File(filepath.Join(dir, "interruption-notice"))
		})(ctx, name, boot)
	}, capacity.Offer{ID: "local-od", CPUMillis: 2000, MemoryBytes: 4 << 30, PricePerHour: usd(500_000)},
		local.WithSpotOffer(capacity.Offer{ID: "local-spot", CPUMillis: 2000, MemoryBytes: 4 << 30, PricePerHour: usd(100_000), InterruptionRate: 0.05}))
	sf.fleet = newFleet(t, invitedOnly, func(c *controlplane.Config) {
		rc := &rentals.Config{Provider: sf.provider, OwnershipToken: "wf-e2e", IdleTimeout: time.Minute, Interval: 200 * time.Millisecond}
		tune(rc)
		c.Capacity = rc
	})
	return sf
}

// rentalOf is the rental whose node is nodeID.
func (sf *spotFleet) rentalOf(nodeID string) schemas.Rental {
	sf.t.Helper()
	for _, rt := range sf.rentals() {
		if rt.NodeID == nodeID {
			return rt
		}
	}
	sf.t.Fatalf("no rental for node %s", nodeID)
	return schemas.Rental{}
}

// runningAttempt waits until run id is running its attempt'th attempt and
// returns it.
func (sf *spotFleet) runningAttempt(id string, attempt int) schemas.Run {
	sf.t.Helper()
	var r schemas.Run
	sf.eventually(90*time.Second, "attempt to run", func() bool {
		r, _ = sf.run(id)
		if r.Phase.Terminal() {
			sf.t.Fatalf("run %s ended %s (%s) before attempt %d ran", id, r.Phase, r.Reason, attempt)
		}
		return r.Phase == schemas.PhaseRunning && r.Attempt == attempt
	})
	return r
}

// notice writes the interruption notice the machine's agent watches for.
func (sf *spotFleet) notice(nativeRef string) {
	sf.t.Helper()
	sf.mu.Lock()
	dir := sf.dirs[nativeRef]
	sf.mu.Unlock()
	if err := os.WriteFile(filepath.Join(dir, "interruption-notice"), []byte(time.Now().Add(2*time.Minute).UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
		sf.t.Fatal(err)
	}
}

// TestAcceptance_SpotInterruptionRequeues: a Run that allows spot is
// rented the cheaper spot machine, which is taken back while the Run
// runs. The rental ends (interrupted, then terminated: its slot free),
// the Run goes back to the queue with reason interrupted, and it finishes
// on an on-demand machine, because the interrupted pool is penalised. Then,
// with two rental slots, a spot-only Run is interrupted five times in a row
// (the first time by its node's own notice) and renting never stops.
func TestAcceptance_SpotInterruptionRequeues(t *testing.T) {
	w := newWorld(t)
	t.Run("falls back to on-demand", func(t *testing.T) {
		sf := newSpotFleet(t, func(c *rentals.Config) { c.SpotPenalty = 10 * time.Minute })
		id := sf.submit(schemas.RunRequest{RequestID: "spot-1", Image: w.image.Reference, Command: []string{"sleep", "4"}, Spot: schemas.SpotAllowed})
		r := sf.runningAttempt(id, 1)
		spot := sf.rentalOf(r.NodeID)
		if !spot.Interruptible || spot.OfferID != "local-spot" || !strings.Contains(spot.Why, "spot offer local-spot") || !strings.Contains(spot.Why, "on-demand alternative") {
			t.Fatalf("first rental %+v: want the spot offer, chosen over the on-demand one", spot)
		}
		if rec := sf.nodeRecord(r.NodeID); !rec.Interruptible {
			t.Fatalf("the spot rental's node is not marked interruptible: %+v", rec)
		}
		if err := sf.provider.Interrupt(context.Background(), spot.NativeRef); err != nil {
			t.Fatal(err)
		}
		done := sf.waitPhase(id, schemas.PhaseSucceeded, 120*time.Second)
		if done.NodeID == r.NodeID || done.Attempt != 2 {
			t.Fatalf("run finished on %s in attempt %d; want another node, attempt 2", done.NodeID, done.Attempt)
		}
		if len(done.Attempts) < 2 || done.Attempts[0].Outcome != schemas.CodeInterrupted {
			t.Fatalf("attempts %+v: the first must have ended interrupted", done.Attempts)
		}
		od := sf.rentalOf(done.NodeID)
		if od.Interruptible || !strings.Contains(od.Why, "left out") || !strings.Contains(od.Why, spot.RentalID) {
			t.Fatalf("second rental %+v: want on-demand, the interrupted pool left out", od)
		}
		sf.eventually(30*time.Second, "the interrupted rental to end", func() bool {
			rt := sf.rentalOf(r.NodeID)
			return rt.State.Done() && !rt.InterruptedAt().IsZero()
		})
		requeued := false
		for _, ev := range sf.events(id) {
			requeued = requeued || ev.Code == schemas.CodeInterrupted && strings.Contains(ev.Message, spot.RentalID)
		}
		if !requeued {
			t.Errorf("no event says the run was requeued because rental %s was interrupted", spot.RentalID)
		}
	})
	t.Run("five interruptions in a row", func(t *testing.T) {
		sf := newSpotFleet(t, func(c *rentals.Config) { c.SpotPenalty, c.MaxRentals = -1, 2 })
		id := sf.submit(schemas.RunRequest{RequestID: "spot-2", Image: w.image.Reference, Command: []string{"sleep", "4"}, Spot: schemas.SpotOnly,
			Retry: &schemas.RetryPolicy{On: []schemas.RetryEvent{schemas.RetryInterrupted}, MaxAttempts: 10}})
		seen := map[string]bool{}
		for i := 1; i <= 5; i++ {
			r := sf.runningAttempt(id, i)
			rt := sf.rentalOf(r.NodeID)
			if !rt.Interruptible || seen[rt.RentalID] {
				t.Fatalf("attempt %d on rental %+v: want a fresh spot rental", i, rt)
			}
			seen[rt.RentalID] = true
			if i == 1 {
				sf.notice(rt.NativeRef)
			} else if err := sf.provider.Interrupt(context.Background(), rt.NativeRef); err != nil {
				t.Fatal(err)
			}
			sf.eventually(60*time.Second, "the attempt to end", func() bool {
				now, _ := sf.run(id)
				return now.Attempt > i || now.Phase != schemas.PhaseRunning
			})
		}
		done := sf.waitPhase(id, schemas.PhaseSucceeded, 120*time.Second)
		if done.Attempt != 6 {
			t.Fatalf("run succeeded in attempt %d; want 6", done.Attempt)
		}
		sf.eventually(30*time.Second, "every interrupted rental to end", func() bool {
			ended := 0
			for _, rt := range sf.rentals() {
				if !rt.InterruptedAt().IsZero() && rt.State.Done() {
					ended++
				}
			}
			return ended == 5
		})
		byNotice := 0
		for _, rt := range sf.rentals() {
			if strings.Contains(rt.LastError, "interruption notice") {
				byNotice++
			}
		}
		if byNotice != 1 {
			t.Errorf("%d rentals record the node's own notice; want 1", byNotice)
		}
	})
}
