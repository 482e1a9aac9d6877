package conformance

import (
	"errors"
	"slices"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// checkLifecycle: provision → observe through valid states to running →
// terminate → terminated (or not found, where the provider forgets), and
// the machine leaves the owned listing.
func checkLifecycle(h *harness) {
	rental := h.rental()
	cmd := h.command(rental, 1)
	rec := h.mustProvision(cmd)
	if rec.Interruptible && !h.pickOffer().Interruptible {
		h.t.Errorf("on-demand provision came back interruptible")
	}
	ref := cmd.Ref(rec.NativeRef)

	running := h.awaitState(ref, capacity.StateRunning)
	if running.Interrupted {
		h.t.Errorf("a running on-demand machine reports Interrupted")
	}

	trec, err := h.terminate(ref, 1)
	if err != nil {
		h.t.Fatalf("TerminateCapacity: %v", err)
	}
	h.checkReceipt("terminate", trec)
	if trec.NativeRef != ref.NativeRef {
		h.t.Errorf("terminate receipt names %s, want %s", trec.NativeRef, ref.NativeRef)
	}
	if trec.State != capacity.StateTerminating && trec.State != capacity.StateTerminated {
		h.t.Errorf("terminate receipt state %q, want terminating or terminated", trec.State)
	}
	h.awaitGone(ref)

	if h.s.ListOwned {
		owned, err := retry(h, func() ([]capacity.OwnedCapacity, error) {
			return h.p.ListOwnedCapacity(h.ctx, capacity.OwnershipQuery{OwnershipToken: h.o.OwnershipToken, RentalID: rental})
		})
		if err != nil {
			h.t.Fatalf("ListOwnedCapacity: %v", err)
		}
		if slices.ContainsFunc(owned, func(o capacity.OwnedCapacity) bool { return o.NativeRef == ref.NativeRef }) {
			h.t.Errorf("terminated machine %s is still listed as owned", ref.NativeRef)
		}
	}
}

// checkTerminateIdempotent: terminating twice succeeds and the second says
// Duplicate; terminating a machine already gone still succeeds.
func checkTerminateIdempotent(h *harness) {
	cmd := h.command(h.rental(), 1)
	ref := cmd.Ref(h.mustProvision(cmd).NativeRef)
	h.awaitState(ref, capacity.StateRunning)
	if _, err := h.terminate(ref, 1); err != nil {
		h.t.Fatalf("first TerminateCapacity: %v", err)
	}
	again, err := h.terminate(ref, 1)
	if err != nil {
		h.t.Fatalf("second TerminateCapacity: %v", err)
	}
	if !again.Duplicate {
		h.t.Errorf("second terminate of %s did not say Duplicate", ref.NativeRef)
	}
	h.awaitGone(ref)
	if _, err := h.terminate(ref, 1); err != nil && !errors.Is(err, capacity.ErrNotFound) {
		h.t.Errorf("terminate after the machine is gone: %v", err)
	} else if err != nil {
		// Not found is an honest answer only from a provider that forgets.
		if h.s.ObserveAfterTerminate {
			h.t.Errorf("terminate after gone: %v, but the provider promises terminated machines stay observable", err)
		}
	}
}
