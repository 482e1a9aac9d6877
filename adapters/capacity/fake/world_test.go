package fake_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/fake"
)

func newWorld(t *testing.T, cfg fake.Config) *fake.Provider {
	t.Helper()
	p, err := fake.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func provisionCmd(rental, offer string) capacity.ProvisionCommand {
	return capacity.ProvisionCommand{OperationKey: "op-" + rental, RentalID: rental, Generation: 1,
		OwnershipToken: "us", OfferID: offer}
}

func TestNewRefusesContradictorySupport(t *testing.T) {
	_, err := fake.New(fake.Config{Support: &capacity.Support{IdempotentProvision: capacity.IdempotencyNone}})
	if !errors.Is(err, capacity.ErrInvalid) {
		t.Fatalf("none without list_owned: got %v, want ErrInvalid", err)
	}
}

// scenario drives a world through a fixed sequence of calls and returns its
// trace.
func scenario(t *testing.T, seed uint64) []string {
	p := newWorld(t, fake.Config{Seed: seed, Latency: fake.DefaultLatency(), Faults: faulty})
	ctx := context.Background()
	for i := range 20 {
		cmd := provisionCmd(fmt.Sprintf("r%d", i), "fake-a100x1")
		rec, err := p.ProvisionCapacity(ctx, cmd)
		p.Advance(time.Minute)
		if err == nil {
			_, _ = p.ObserveCapacity(ctx, cmd.Ref(rec.NativeRef))
			if i%3 == 0 {
				_, _ = p.TerminateCapacity(ctx, capacity.Command{Ref: cmd.Ref(rec.NativeRef), Generation: 1})
			}
		}
	}
	return p.Trace()
}

func TestSameSeedSameWorld(t *testing.T) {
	a, b := scenario(t, 42), scenario(t, 42)
	if !slices.Equal(a, b) {
		t.Fatalf("two runs with seed 42 differ:\n%v\n%v", a, b)
	}
	if slices.Equal(a, scenario(t, 43)) {
		t.Fatalf("seeds 42 and 43 gave identical traces; faults are not drawn from the seed")
	}
}

func TestOperationKeyReusedForAnotherRequestIsRefused(t *testing.T) {
	p := newWorld(t, fake.Config{})
	ctx := context.Background()
	cmd := provisionCmd("r1", "fake-a100x1")
	cmd.RequestHash = "sha256:aaa"
	if _, err := p.ProvisionCapacity(ctx, cmd); err != nil {
		t.Fatal(err)
	}
	if rec, err := p.ProvisionCapacity(ctx, cmd); err != nil || !rec.Duplicate {
		t.Fatalf("same request again: %+v, %v", rec, err)
	}
	cmd.RequestHash = "sha256:bbb"
	if _, err := p.ProvisionCapacity(ctx, cmd); !errors.Is(err, capacity.ErrInvalid) {
		t.Fatalf("key reused for another request: got %v, want ErrInvalid", err)
	}
}

func TestLostResponseIsAppliedAndRetrySafe(t *testing.T) {
	for _, mech := range []capacity.Idempotency{capacity.IdempotencyOperationKey, capacity.IdempotencyNone} {
		t.Run(string(mech), func(t *testing.T) {
			s := fake.DefaultSupport()
			s.IdempotentProvision = mech
			p := newWorld(t, fake.Config{Support: &s, Faults: fake.Faults{LostResponse: 1}})
			cmd := provisionCmd("r1", "fake-a100x1")
			for range 5 {
				_, err := p.ProvisionCapacity(context.Background(), cmd)
				if !errors.Is(err, fake.ErrResponseLost) || !capacity.Ambiguous(err) {
					t.Fatalf("got %v, want an ambiguous ErrResponseLost", err)
				}
			}
			if n := p.AllocationCount("r1"); n != 1 {
				t.Fatalf("%d allocations after lost responses and retries, want 1", n)
			}
		})
	}
}

func TestDuplicateDeliveryAllocatesOnce(t *testing.T) {
	p := newWorld(t, fake.Config{Faults: fake.Faults{DuplicateDelivery: 1}})
	rec, err := p.ProvisionCapacity(context.Background(), provisionCmd("r1", "fake-a100x1"))
	if err != nil {
		t.Fatal(err)
	}
	// The caller's first call was delivered twice: what it hears is the
	// second delivery, a duplicate of the first.
	if !rec.Duplicate || p.AllocationCount("r1") != 1 {
		t.Fatalf("duplicate=%v allocations=%d, want true and 1", rec.Duplicate, p.AllocationCount("r1"))
	}
}

func TestStockOutAllocatesNothing(t *testing.T) {
	p := newWorld(t, fake.Config{Faults: fake.Faults{StockOut: 1}})
	_, err := p.ProvisionCapacity(context.Background(), provisionCmd("r1", "fake-a100x1"))
	if !errors.Is(err, capacity.ErrOutOfStock) {
		t.Fatalf("got %v, want ErrOutOfStock", err)
	}
	if n := len(p.Allocations()); n != 0 {
		t.Fatalf("%d allocations after a stock-out", n)
	}
}

func TestRateLimitCarriesRetryAfter(t *testing.T) {
	p := newWorld(t, fake.Config{Faults: fake.Faults{RateLimit: 1, RetryAfter: 7 * time.Second}})
	_, err := p.ListCapacity(context.Background(), capacity.OfferQuery{})
	if d, ok := capacity.RetryAfter(err); !errors.Is(err, capacity.ErrRateLimited) || !ok || d != 7*time.Second {
		t.Fatalf("got %v (retry after %v), want ErrRateLimited after 7s", err, d)
	}
}

func TestRejectedCredentials(t *testing.T) {
	p := newWorld(t, fake.Config{RejectCredentials: true})
	if err := p.Verify(context.Background()); !errors.Is(err, capacity.ErrUnauthorized) {
		t.Fatalf("got %v, want ErrUnauthorized", err)
	}
}

func TestSpotInterruptionIsDatedAndFlagged(t *testing.T) {
	p := newWorld(t, fake.Config{Seed: 7, Latency: fake.DefaultLatency(),
		Faults: fake.Faults{SpotInterruption: 1, SpotInterruptWithin: 10 * time.Minute}})
	ctx := context.Background()
	cmd := provisionCmd("r1", "fake-a100x1-spot")
	rec, err := p.ProvisionCapacity(ctx, cmd)
	if err != nil || !rec.Interruptible {
		t.Fatalf("provision spot: %+v, %v", rec, err)
	}
	start := p.Now()
	p.Advance(time.Hour)
	obs, err := p.ObserveCapacity(ctx, cmd.Ref(rec.NativeRef))
	if err != nil {
		t.Fatal(err)
	}
	if obs.State != capacity.StateTerminated || !obs.Interrupted {
		t.Fatalf("after an hour: %+v, want terminated and interrupted", obs)
	}
	// The interruption is dated by the world, not by our look.
	if !obs.StateSince.After(start) || !obs.StateSince.Before(start.Add(15*time.Minute)) || obs.StateSince.Equal(obs.ObservedAt) {
		t.Fatalf("StateSince %v, observed %v: want the interruption's own time within the window", obs.StateSince, obs.ObservedAt)
	}
}

func TestStateSinceIsTheMachinesOwnTime(t *testing.T) {
	lat := fake.Latency{Provision: time.Minute, Boot: time.Minute}
	p := newWorld(t, fake.Config{Latency: lat})
	ctx := context.Background()
	cmd := provisionCmd("r1", "fake-a100x1")
	rec, err := p.ProvisionCapacity(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	p.Advance(10 * time.Minute)
	obs, err := p.ObserveCapacity(ctx, cmd.Ref(rec.NativeRef))
	if err != nil {
		t.Fatal(err)
	}
	if want := rec.AcceptedAt.Add(2 * time.Minute); obs.State != capacity.StateRunning || !obs.StateSince.Equal(want) {
		t.Fatalf("got %s since %v, want running since %v", obs.State, obs.StateSince, want)
	}
}

func TestMaxLifetimeReclaims(t *testing.T) {
	p := newWorld(t, fake.Config{})
	ctx := context.Background()
	cmd := provisionCmd("r1", "fake-a100x1")
	cmd.MaxLifetimeSeconds = 60
	rec, err := p.ProvisionCapacity(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	p.Advance(59 * time.Second)
	if obs, _ := p.ObserveCapacity(ctx, cmd.Ref(rec.NativeRef)); obs.State != capacity.StateRunning {
		t.Fatalf("before its lifetime: %s", obs.State)
	}
	p.Advance(2 * time.Second)
	obs, _ := p.ObserveCapacity(ctx, cmd.Ref(rec.NativeRef))
	if obs.State != capacity.StateTerminated || obs.Interrupted || !obs.StateSince.Equal(rec.AcceptedAt.Add(time.Minute)) {
		t.Fatalf("after its lifetime: %+v", obs)
	}
}

func TestForeignMachineIsNeverTouched(t *testing.T) {
	p := newWorld(t, fake.Config{})
	ctx := context.Background()
	ref := p.PlantForeign("r1", "them")
	_, err := p.TerminateCapacity(ctx, capacity.Command{Ref: capacity.Ref{NativeRef: ref, OwnershipToken: "us"}, Generation: 99})
	if !errors.Is(err, capacity.ErrNotFound) {
		t.Fatalf("terminate under our token: %v, want ErrNotFound", err)
	}
	obs, err := p.ObserveCapacity(ctx, capacity.Ref{NativeRef: ref, OwnershipToken: "them"})
	if err != nil || obs.State != capacity.StateRunning {
		t.Fatalf("their machine after our refused terminate: %+v, %v", obs, err)
	}
}

// TestChaosNeverAllocatesTwice runs many seeds of a caller that retries
// every ambiguous answer, repeats provisions at random, and terminates, in
// both idempotency modes under heavy faults.
func TestChaosNeverAllocatesTwice(t *testing.T) {
	heavy := fake.Faults{StockOut: 0.2, LostResponse: 0.4, DuplicateDelivery: 0.4, RateLimit: 0.2, SpotInterruption: 0.5}
	for _, mech := range []capacity.Idempotency{capacity.IdempotencyOperationKey, capacity.IdempotencyNone} {
		for seed := range uint64(40) {
			s := fake.DefaultSupport()
			s.IdempotentProvision = mech
			p := newWorld(t, fake.Config{Seed: seed, Support: &s, Latency: fake.DefaultLatency(), Faults: heavy})
			caller := rand.New(rand.NewPCG(seed, 1))
			ctx := context.Background()
			live := map[string]capacity.ProvisionCommand{}
			for i := range 30 {
				cmd := provisionCmd(fmt.Sprintf("r%d", i), "fake-a100x1")
				if caller.IntN(2) == 0 {
					cmd.OfferID = "fake-a100x1-spot"
				}
				if provisionUntilKnown(ctx, p, cmd) == nil {
					live[cmd.RentalID] = cmd
				}
				p.Advance(time.Duration(caller.IntN(120)) * time.Second)
				// Repeat an earlier provision whose machine still exists: the
				// world must answer the same machine. (Under "none" a key is
				// remembered only while its machine exists, so a caller never
				// replays a provision whose machine it saw reclaimed.)
				if old, ok := live[fmt.Sprintf("r%d", caller.IntN(i+1))]; ok {
					if exists(ctx, p, old) {
						_ = provisionUntilKnown(ctx, p, old)
					} else {
						delete(live, old.RentalID)
					}
				}
				if caller.IntN(4) == 0 {
					for rental, c := range live {
						terminateUntilKnown(ctx, p, c)
						delete(live, rental)
						break
					}
				}
			}
			if d := p.DoubleAllocations(); len(d) > 0 {
				t.Fatalf("%s seed %d: allocated twice: %v", mech, seed, d)
			}
		}
	}
}

func provisionUntilKnown(ctx context.Context, p *fake.Provider, cmd capacity.ProvisionCommand) error {
	for {
		_, err := p.ProvisionCapacity(ctx, cmd)
		if err == nil || !capacity.Ambiguous(err) && !errors.Is(err, capacity.ErrRateLimited) {
			return err
		}
	}
}

// exists reports whether the rental's machine is still there, as the
// caller's own observations would tell it.
func exists(ctx context.Context, p *fake.Provider, cmd capacity.ProvisionCommand) bool {
	for {
		owned, err := p.ListOwnedCapacity(ctx, capacity.OwnershipQuery{OwnershipToken: cmd.OwnershipToken, RentalID: cmd.RentalID})
		if err == nil {
			return len(owned) > 0
		}
	}
}

func terminateUntilKnown(ctx context.Context, p *fake.Provider, cmd capacity.ProvisionCommand) {
	var owned []capacity.OwnedCapacity
	for {
		var err error
		if owned, err = p.ListOwnedCapacity(ctx, capacity.OwnershipQuery{OwnershipToken: cmd.OwnershipToken, RentalID: cmd.RentalID}); err == nil {
			break
		}
	}
	for _, o := range owned {
		for {
			_, err := p.TerminateCapacity(ctx, capacity.Command{Ref: cmd.Ref(o.NativeRef), Generation: cmd.Generation})
			if err == nil || !capacity.Ambiguous(err) && !errors.Is(err, capacity.ErrRateLimited) {
				break
			}
		}
	}
}
