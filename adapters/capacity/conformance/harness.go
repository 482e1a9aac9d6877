package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/schemas"
)

// callTimeout bounds one check's real time, whatever the provider's clock.
const callTimeout = 60 * time.Second

// cleanupGeneration is newer than any generation a check uses, so the
// best-effort terminate at the end of a check is never fenced off.
const cleanupGeneration = 1 << 32

// harness is one check's view of one provider.
type harness struct {
	t     *testing.T
	p     capacity.Provider
	o     Options
	s     capacity.Support
	ctx   context.Context
	n     int
	offer *capacity.Offer
}

func newHarness(t *testing.T, p capacity.Provider, o Options) *harness {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return &harness{t: t, p: p, o: o, s: p.Support(), ctx: ctx}
}

// rental returns a fresh rental id for this check.
func (h *harness) rental() string {
	h.n++
	name := h.t.Name()
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	name = strings.ToLower(name)
	if len(name) > 24 {
		name = name[:24]
	}
	return fmt.Sprintf("cf-%s-%d", name, h.n)
}

// bootstrap is a NodeBootstrap with characters that break naive quoting
// (quotes, $, backticks, newlines, non-ASCII), so "verbatim" is tested
// rather than assumed.
func bootstrap(rental string, gen uint64) schemas.NodeBootstrap {
	return schemas.NodeBootstrap{
		ControlPlaneURL: "nats://cp.example.test:4222",
		NodeID:          "node-" + rental,
		RentalID:        rental,
		Generation:      gen,
		EnrollmentToken: "tok-'\"$(echo pwned)`id`\\n\n\u00e9\u2603-" + rental,
		ExpiresAt:       time.Date(2031, time.February, 3, 4, 5, 6, 789000000, time.UTC),
		AgentVersion:    "v0.0.0-conformance",
	}
}

// command is a valid provision for rental at generation gen.
func (h *harness) command(rental string, gen uint64) capacity.ProvisionCommand {
	return capacity.ProvisionCommand{
		OperationKey:   fmt.Sprintf("op-%s-g%d", rental, gen),
		RequestHash:    "sha256:conformance",
		RentalID:       rental,
		Generation:     gen,
		OwnershipToken: h.o.OwnershipToken,
		OfferID:        h.pickOffer().ID,
		Bootstrap:      bootstrap(rental, gen),
	}
}

// pickOffer is Options.OfferID or the first available on-demand offer.
func (h *harness) pickOffer() capacity.Offer {
	h.t.Helper()
	if h.offer != nil {
		return *h.offer
	}
	offers, err := retry(h, func() ([]capacity.Offer, error) {
		return h.p.ListCapacity(h.ctx, capacity.OfferQuery{AvailableOnly: true})
	})
	if err != nil {
		h.t.Fatalf("ListCapacity: %v", err)
	}
	for _, o := range offers {
		if (h.o.OfferID == "" && !o.Interruptible) || o.ID == h.o.OfferID {
			h.offer = &o
			return o
		}
	}
	h.t.Fatalf("no offer to provision among %d (want %q)", len(offers), h.o.OfferID)
	return capacity.Offer{}
}

// retry repeats an ambiguous or rate-limited call, as a caller holding the
// same OperationKey would.
func retry[T any](h *harness, f func() (T, error)) (T, error) {
	var v T
	var err error
	for range h.o.Retries + 1 {
		if v, err = f(); err == nil {
			return v, nil
		}
		switch {
		case h.ctx.Err() != nil:
			return v, err
		case errors.Is(err, capacity.ErrRateLimited):
			d, ok := capacity.RetryAfter(err)
			if !ok {
				d = h.o.PollInterval
			}
			h.wait(d)
		case errors.Is(err, capacity.ErrOutOfStock) && h.o.TransientStockOuts:
		case capacity.Ambiguous(err):
		default:
			return v, err
		}
	}
	return v, err
}

// wait lets d of provider time pass.
func (h *harness) wait(d time.Duration) {
	if h.o.Advance != nil {
		h.o.Advance(h.p, d)
		return
	}
	select {
	case <-time.After(d):
	case <-h.ctx.Done():
	}
}

// provision provisions cmd (with retries) and schedules a best-effort
// terminate when the check ends.
func (h *harness) provision(cmd capacity.ProvisionCommand) (capacity.Receipt, error) {
	rec, err := retry(h, func() (capacity.Receipt, error) { return h.p.ProvisionCapacity(h.ctx, cmd) })
	if err == nil {
		h.cleanup(cmd.Ref(rec.NativeRef))
	}
	return rec, err
}

func (h *harness) mustProvision(cmd capacity.ProvisionCommand) capacity.Receipt {
	h.t.Helper()
	rec, err := h.provision(cmd)
	if err != nil {
		h.t.Fatalf("ProvisionCapacity(%s): %v", cmd.OperationKey, err)
	}
	h.checkReceipt("provision", rec)
	return rec
}

func (h *harness) cleanup(ref capacity.Ref) {
	h.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = h.p.TerminateCapacity(ctx, capacity.Command{Ref: ref, OperationKey: "cleanup-" + ref.NativeRef, Generation: cleanupGeneration})
	})
}

func (h *harness) terminate(ref capacity.Ref, gen uint64) (capacity.Receipt, error) {
	return retry(h, func() (capacity.Receipt, error) {
		return h.p.TerminateCapacity(h.ctx, capacity.Command{Ref: ref, OperationKey: "term-" + ref.NativeRef, Generation: gen})
	})
}

func (h *harness) observe(ref capacity.Ref) (capacity.Observation, error) {
	obs, err := retry(h, func() (capacity.Observation, error) { return h.p.ObserveCapacity(h.ctx, ref) })
	if err == nil {
		h.checkObservation(ref, obs)
	}
	return obs, err
}

// await polls ref until done says so, letting PollInterval pass between
// looks, for at most Settle of provider time.
func (h *harness) await(ref capacity.Ref, what string, done func(capacity.Observation, error) bool) (capacity.Observation, error) {
	h.t.Helper()
	var obs capacity.Observation
	var err error
	for waited := time.Duration(0); ; waited += h.o.PollInterval {
		obs, err = h.observe(ref)
		if done(obs, err) {
			return obs, err
		}
		if waited >= h.o.Settle || h.ctx.Err() != nil {
			h.t.Fatalf("%s: %s not reached after %v; last state %q, err %v", ref.NativeRef, what, h.o.Settle, obs.State, err)
		}
		h.wait(h.o.PollInterval)
	}
}

// awaitState waits for one of states; an error or failed state on the way
// fails the check.
func (h *harness) awaitState(ref capacity.Ref, states ...capacity.State) capacity.Observation {
	h.t.Helper()
	obs, _ := h.await(ref, fmt.Sprint(states), func(o capacity.Observation, err error) bool {
		if err != nil {
			h.t.Fatalf("observe %s while waiting for %v: %v", ref.NativeRef, states, err)
		}
		for _, s := range states {
			if o.State == s {
				return true
			}
		}
		if o.State == capacity.StateFailed {
			h.t.Fatalf("observe %s: failed while waiting for %v", ref.NativeRef, states)
		}
		return false
	})
	return obs
}

// awaitGone waits until the machine is terminated, or, where the provider
// forgets terminated machines, not found. ObserveAfterTerminate forbids
// not found.
func (h *harness) awaitGone(ref capacity.Ref) {
	h.t.Helper()
	h.await(ref, "terminated", func(o capacity.Observation, err error) bool {
		switch {
		case err == nil:
			return o.State == capacity.StateTerminated
		case errors.Is(err, capacity.ErrNotFound):
			if h.s.ObserveAfterTerminate {
				h.t.Fatalf("observe %s after terminate: %v, but Support.ObserveAfterTerminate promises it stays observable", ref.NativeRef, err)
			}
			return true
		default:
			h.t.Fatalf("observe %s after terminate: %v", ref.NativeRef, err)
			return false
		}
	})
}

// allocations counts machines ever allocated for rental, through the hook
// or, lacking one, the owned listing.
func (h *harness) allocations(rental string) int {
	h.t.Helper()
	if h.o.Allocations != nil {
		return h.o.Allocations(h.t, h.p, rental)
	}
	if !h.s.ListOwned {
		h.t.Skip("no Allocations hook and no ListOwned: allocations cannot be counted")
	}
	owned, err := retry(h, func() ([]capacity.OwnedCapacity, error) {
		return h.p.ListOwnedCapacity(h.ctx, capacity.OwnershipQuery{OwnershipToken: h.o.OwnershipToken, RentalID: rental})
	})
	if err != nil {
		h.t.Fatalf("ListOwnedCapacity: %v", err)
	}
	return len(owned)
}

func (h *harness) checkReceipt(op string, r capacity.Receipt) {
	h.t.Helper()
	if r.NativeRef == "" {
		h.t.Errorf("%s receipt has no NativeRef", op)
	}
	if !r.State.Valid() {
		h.t.Errorf("%s receipt state %q is not a capacity.State", op, r.State)
	}
	if r.AcceptedAt.IsZero() {
		h.t.Errorf("%s receipt has no AcceptedAt", op)
	}
	if r.Interruptible && !h.s.Spot {
		h.t.Errorf("%s receipt is interruptible but Support.Spot is false", op)
	}
	if r.Pricing.Exact && !h.s.ExactPricing {
		h.t.Errorf("%s receipt claims exact pricing but Support.ExactPricing is false", op)
	}
}

func (h *harness) checkObservation(ref capacity.Ref, o capacity.Observation) {
	h.t.Helper()
	if o.NativeRef != ref.NativeRef {
		h.t.Errorf("observation of %s names %s", ref.NativeRef, o.NativeRef)
	}
	if !o.State.Valid() {
		h.t.Errorf("observation state %q is not a capacity.State", o.State)
	}
	if o.ObservedAt.IsZero() {
		h.t.Errorf("observation of %s has no ObservedAt", ref.NativeRef)
	}
	if !o.StateSince.IsZero() && o.StateSince.After(o.ObservedAt) {
		h.t.Errorf("observation of %s: StateSince %v is after ObservedAt %v", ref.NativeRef, o.StateSince, o.ObservedAt)
	}
	if o.Interrupted && !h.s.Spot {
		h.t.Errorf("observation of %s reports an interruption but Support.Spot is false", ref.NativeRef)
	}
}

// wantCode fails unless err carries code.
func (h *harness) wantCode(what string, err error, sentinel error) {
	h.t.Helper()
	if !errors.Is(err, sentinel) {
		h.t.Errorf("%s: got %v, want %v", what, err, sentinel)
	}
}
