package conformance

import (
	"errors"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// checkStopResume: Stop and Start answer ErrUnsupported exactly when
// Support says they are missing; where present, stop reaches stopped under
// the same identity (twice is Duplicate) and start brings it back to
// running.
func checkStopResume(h *harness) {
	cmd := h.command(h.rental(), 1)
	ref := cmd.Ref(h.mustProvision(cmd).NativeRef)
	h.awaitState(ref, capacity.StateRunning)
	c := capacity.Command{Ref: ref, OperationKey: "stop-" + ref.NativeRef, Generation: 1}

	if !h.s.Stop {
		_, err := retry(h, func() (capacity.Receipt, error) { return h.p.StopCapacity(h.ctx, c) })
		h.wantCode("StopCapacity without Support.Stop", err, capacity.ErrUnsupported)
	}
	if !h.s.Resume {
		c.OperationKey = "start-" + ref.NativeRef
		_, err := retry(h, func() (capacity.Receipt, error) { return h.p.StartCapacity(h.ctx, c) })
		h.wantCode("StartCapacity without Support.Resume", err, capacity.ErrUnsupported)
	}
	if !h.s.Stop {
		return
	}

	c.OperationKey = "stop-" + ref.NativeRef
	rec, err := retry(h, func() (capacity.Receipt, error) { return h.p.StopCapacity(h.ctx, c) })
	if err != nil {
		h.t.Fatalf("StopCapacity: %v", err)
	}
	h.checkReceipt("stop", rec)
	if rec.NativeRef != ref.NativeRef {
		h.t.Errorf("stop answered machine %s, want %s (same identity)", rec.NativeRef, ref.NativeRef)
	}
	h.awaitState(ref, capacity.StateStopped)
	again, err := retry(h, func() (capacity.Receipt, error) { return h.p.StopCapacity(h.ctx, c) })
	if err != nil {
		h.t.Fatalf("second StopCapacity: %v", err)
	}
	if !again.Duplicate {
		h.t.Errorf("stopping a stopped machine did not say Duplicate")
	}
	if !h.s.Resume {
		return
	}
	c.OperationKey = "start-" + ref.NativeRef
	if _, err := retry(h, func() (capacity.Receipt, error) { return h.p.StartCapacity(h.ctx, c) }); err != nil {
		h.t.Fatalf("StartCapacity: %v", err)
	}
	h.awaitState(ref, capacity.StateRunning)
}

// checkSpot: asking for interruptible capacity from a provider without
// Support.Spot yields an on-demand machine that says so; with Spot, a spot
// offer yields an interruptible machine.
func checkSpot(h *harness) {
	cmd := h.command(h.rental(), 1)
	cmd.Interruptible = true
	rec := h.mustProvision(cmd)
	if !h.s.Spot {
		if rec.Interruptible {
			h.t.Errorf("provider without Support.Spot allocated interruptible capacity")
		}
		return
	}
	offers, err := retry(h, func() ([]capacity.Offer, error) {
		return h.p.ListCapacity(h.ctx, capacity.OfferQuery{Interruptible: true, AvailableOnly: true})
	})
	if err != nil {
		h.t.Fatalf("ListCapacity(interruptible): %v", err)
	}
	for _, o := range offers {
		if !o.Interruptible {
			continue
		}
		spot := h.command(h.rental(), 1)
		spot.OfferID, spot.Interruptible = o.ID, true
		r := h.mustProvision(spot)
		if !r.Interruptible {
			h.t.Errorf("provision of spot offer %s came back on-demand", o.ID)
		}
		if h.o.Interrupt != nil {
			checkInterruption(h, spot.Ref(r.NativeRef))
		}
		return
	}
	h.t.Log("Support.Spot holds but no interruptible offer is listed now")
}

// checkInterruption: a spot machine the market takes back is reported
// interrupted (a different fact from a stop), and stays so until it is
// gone; terminating what is left of it succeeds.
func checkInterruption(h *harness, ref capacity.Ref) {
	// A market may take it back before it runs; that is an interruption too.
	h.await(ref, "running", func(o capacity.Observation, err error) bool {
		return err == nil && (o.State == capacity.StateRunning || o.Interrupted)
	})
	h.o.Interrupt(h.t, h.p, ref.NativeRef)
	obs, _ := h.await(ref, "interrupted", func(o capacity.Observation, err error) bool { return err == nil && o.Interrupted })
	if !obs.Interrupted {
		h.t.Fatalf("an interrupted machine is observed %+v", obs)
	}
	if _, err := retry(h, func() (capacity.Receipt, error) {
		return h.p.TerminateCapacity(h.ctx, capacity.Command{Ref: ref, OperationKey: ref.RentalID + "-reclaim", Generation: 1})
	}); err != nil && !errors.Is(err, capacity.ErrNotFound) {
		h.t.Errorf("terminate an interrupted machine: %v", err)
	}
}

// checkMaxLifetime: where the provider enforces MaxLifetimeSeconds, a
// machine is gone once its lifetime passes, with nobody terminating it.
func checkMaxLifetime(h *harness) {
	if !h.s.MaxLifetime {
		h.t.Skip("Support.MaxLifetime is false")
	}
	if h.o.Advance == nil {
		h.t.Skip("lifetimes are checked only under a virtual clock")
	}
	const lifetime = time.Hour
	cmd := h.command(h.rental(), 1)
	cmd.MaxLifetimeSeconds = int64(lifetime / time.Second)
	ref := cmd.Ref(h.mustProvision(cmd).NativeRef)
	h.awaitState(ref, capacity.StateRunning)
	h.wait(lifetime)
	h.awaitGone(ref)
	if obs, err := h.observe(ref); err == nil && obs.Interrupted {
		h.t.Errorf("a machine reclaimed at the end of its lifetime reports a spot interruption")
	}
}
