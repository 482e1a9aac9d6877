package conformance

import (
	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// checkGenerationFencing: where the provider fences, a command stamped with
// a generation older than the machine's is refused and changes nothing,
// and a provision for the rental under an older generation is refused too;
// the current generation still works.
func checkGenerationFencing(h *harness) {
	if !h.s.GenerationFencing {
		h.t.Skip("Support.GenerationFencing is false: superseded commands are the caller's to stop")
	}
	rental := h.rental()
	cmd := h.command(rental, 2)
	ref := cmd.Ref(h.mustProvision(cmd).NativeRef)
	h.awaitState(ref, capacity.StateRunning)

	stale := capacity.Command{Ref: ref, OperationKey: "stale-term", Generation: 1}
	_, err := retry(h, func() (capacity.Receipt, error) { return h.p.TerminateCapacity(h.ctx, stale) })
	h.wantCode("terminate under generation 1 of a generation-2 machine", err, capacity.ErrStaleGeneration)
	if h.s.Stop {
		stale.OperationKey = "stale-stop"
		_, err := retry(h, func() (capacity.Receipt, error) { return h.p.StopCapacity(h.ctx, stale) })
		h.wantCode("stop under generation 1 of a generation-2 machine", err, capacity.ErrStaleGeneration)
	}
	if obs, err := h.observe(ref); err != nil || obs.State != capacity.StateRunning {
		h.t.Errorf("after refused stale commands the machine is %q (err %v), want running", obs.State, err)
	}

	old := h.command(rental, 1)
	if _, err := h.provision(old); err == nil {
		h.t.Errorf("provision of rental %s under generation 1 after generation 2 was accepted", rental)
	} else {
		h.wantCode("provision under a superseded generation", err, capacity.ErrStaleGeneration)
	}

	if _, err := h.terminate(ref, 2); err != nil {
		h.t.Fatalf("terminate under the current generation: %v", err)
	}
	h.awaitGone(ref)
}
