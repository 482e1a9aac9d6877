package conformance

import (
	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// checkDeclaration: the adapter declares itself, its declared capacity is
// its Support, and its Support does not contradict itself. That Support
// matches behaviour is what the other checks establish, one promise each.
func checkDeclaration(h *harness) {
	d, ok := h.p.(capacity.Declarer)
	if !ok {
		h.t.Fatalf("%T does not implement capacity.Declarer", h.p)
	}
	decl := d.Declaration()
	if decl.Type == "" {
		h.t.Error("Declaration.Type is empty")
	}
	if decl.Lane != capacity.LaneNodes {
		h.t.Errorf("Declaration.Lane = %q; a capacity provider's machines are the %q lane", decl.Lane, capacity.LaneNodes)
	}
	if decl.Capacity == nil {
		h.t.Fatal("Declaration.Capacity is nil for a capacity.Provider")
	}
	if *decl.Capacity != h.s {
		h.t.Errorf("Declaration.Capacity = %+v, Support() = %+v", *decl.Capacity, h.s)
	}
	if err := h.s.Validate(); err != nil {
		h.t.Errorf("Support contradicts itself: %v", err)
	}
}

func checkVerify(h *harness) {
	if _, err := retry(h, func() (struct{}, error) { return struct{}{}, h.p.Verify(h.ctx) }); err != nil {
		h.t.Fatalf("Verify: %v", err)
	}
}

// checkListCapacity: offers are well formed, on-demand by default, and
// interruptible only where Support.Spot holds.
func checkListCapacity(h *harness) {
	offers, err := retry(h, func() ([]capacity.Offer, error) { return h.p.ListCapacity(h.ctx, capacity.OfferQuery{}) })
	if err != nil {
		h.t.Fatalf("ListCapacity: %v", err)
	}
	if len(offers) == 0 {
		h.t.Fatal("ListCapacity returned no offers")
	}
	for _, o := range offers {
		if o.ID == "" || o.Provider == "" {
			h.t.Errorf("offer %+v lacks an ID or Provider", o)
		}
		if o.GPUCount < 0 || o.CPUMillis < 0 || o.MemoryBytes < 0 || o.GPUMemoryBytes < 0 || o.PricePerHour.MicrosPerHour < 0 {
			h.t.Errorf("offer %s has a negative quantity: %+v", o.ID, o)
		}
		if o.Interruptible {
			h.t.Errorf("offer %s is interruptible but the query did not ask for spot", o.ID)
		}
		if o.PricePerHour.Exact && !h.s.ExactPricing {
			h.t.Errorf("offer %s claims an exact price but Support.ExactPricing is false", o.ID)
		}
	}
	spot, err := retry(h, func() ([]capacity.Offer, error) {
		return h.p.ListCapacity(h.ctx, capacity.OfferQuery{Interruptible: true})
	})
	if err != nil {
		h.t.Fatalf("ListCapacity(interruptible): %v", err)
	}
	for _, o := range spot {
		if o.Interruptible && !h.s.Spot {
			h.t.Errorf("offer %s is interruptible but Support.Spot is false", o.ID)
		}
	}
	// A narrowing query never widens the answer.
	big, err := retry(h, func() ([]capacity.Offer, error) {
		q := capacity.OfferQuery{}
		q.Resources.GPUCount = 1 << 20
		return h.p.ListCapacity(h.ctx, q)
	})
	if err != nil {
		h.t.Fatalf("ListCapacity(huge): %v", err)
	}
	if len(big) != 0 {
		h.t.Errorf("ListCapacity for 2^20 GPUs returned %d offers", len(big))
	}
}
