package conformance

import (
	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// foreignToken is another deployment's ownership token.
const foreignToken = "someone-else"

// checkListOwned: the listing includes every machine we provisioned, with
// its rental and generation, and nothing that lacks our token, even a
// machine named like ours; machines that are not ours are not found when we
// observe or terminate them.
func checkListOwned(h *harness) {
	query := capacity.OwnershipQuery{OwnershipToken: h.o.OwnershipToken}
	if !h.s.ListOwned {
		_, err := retry(h, func() ([]capacity.OwnedCapacity, error) { return h.p.ListOwnedCapacity(h.ctx, query) })
		h.wantCode("ListOwnedCapacity without Support.ListOwned", err, capacity.ErrUnsupported)
		return
	}
	ra, rb := h.rental(), h.rental()
	a := h.mustProvision(h.command(ra, 1))
	b := h.mustProvision(h.command(rb, 2))
	var foreign string
	if h.o.PlantForeign != nil {
		foreign = h.o.PlantForeign(h.t, h.p, ra, foreignToken)
	}

	owned, err := retry(h, func() ([]capacity.OwnedCapacity, error) { return h.p.ListOwnedCapacity(h.ctx, query) })
	if err != nil {
		h.t.Fatalf("ListOwnedCapacity: %v", err)
	}
	byRef := map[string]capacity.OwnedCapacity{}
	for _, o := range owned {
		byRef[o.NativeRef] = o
		if o.OwnershipToken != h.o.OwnershipToken {
			h.t.Errorf("listed %s carries token %q, not ours", o.NativeRef, o.OwnershipToken)
		}
		if !o.State.Valid() {
			h.t.Errorf("listed %s has state %q", o.NativeRef, o.State)
		}
	}
	for _, want := range []struct {
		rec    capacity.Receipt
		rental string
		gen    uint64
	}{{a, ra, 1}, {b, rb, 2}} {
		got, ok := byRef[want.rec.NativeRef]
		if !ok {
			h.t.Errorf("machine %s (rental %s) missing from the owned listing", want.rec.NativeRef, want.rental)
			continue
		}
		if got.RentalID != want.rental || got.Generation != want.gen {
			h.t.Errorf("machine %s listed as rental %q gen %d, want %q gen %d", got.NativeRef, got.RentalID, got.Generation, want.rental, want.gen)
		}
	}
	if foreign != "" {
		if _, ok := byRef[foreign]; ok {
			h.t.Errorf("look-alike machine %s with another token was listed as ours", foreign)
		}
		ref := capacity.Ref{RentalID: ra, NativeRef: foreign, OwnershipToken: h.o.OwnershipToken}
		_, err := retry(h, func() (capacity.Observation, error) { return h.p.ObserveCapacity(h.ctx, ref) })
		h.wantCode("observe a look-alike machine", err, capacity.ErrNotFound)
		_, err = retry(h, func() (capacity.Receipt, error) {
			return h.p.TerminateCapacity(h.ctx, capacity.Command{Ref: ref, Generation: cleanupGeneration})
		})
		h.wantCode("terminate a look-alike machine", err, capacity.ErrNotFound)
	}

	// Narrowed to one rental.
	one, err := retry(h, func() ([]capacity.OwnedCapacity, error) {
		return h.p.ListOwnedCapacity(h.ctx, capacity.OwnershipQuery{OwnershipToken: h.o.OwnershipToken, RentalID: rb})
	})
	if err != nil {
		h.t.Fatalf("ListOwnedCapacity(rental): %v", err)
	}
	if len(one) != 1 || one[0].NativeRef != b.NativeRef {
		h.t.Errorf("listing narrowed to rental %s returned %+v, want only %s", rb, one, b.NativeRef)
	}

	// Another deployment sees none of ours.
	theirs, err := retry(h, func() ([]capacity.OwnedCapacity, error) {
		return h.p.ListOwnedCapacity(h.ctx, capacity.OwnershipQuery{OwnershipToken: foreignToken})
	})
	if err != nil {
		h.t.Fatalf("ListOwnedCapacity(foreign): %v", err)
	}
	for _, o := range theirs {
		if o.NativeRef == a.NativeRef || o.NativeRef == b.NativeRef {
			h.t.Errorf("another deployment's listing includes our machine %s", o.NativeRef)
		}
	}

	// Ours, observed under another token, is not found.
	_, err = retry(h, func() (capacity.Observation, error) {
		return h.p.ObserveCapacity(h.ctx, capacity.Ref{NativeRef: a.NativeRef, OwnershipToken: foreignToken})
	})
	h.wantCode("observing our machine under another token", err, capacity.ErrNotFound)
}
