package conformance

import (
	"errors"
	"sync"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// checkProvisionIdempotent: repeating a provision with one OperationKey
// answers the same machine, says Duplicate, and allocates once, whether the
// provider deduplicates or the adapter reconciles by listing.
func checkProvisionIdempotent(h *harness) {
	rental := h.rental()
	cmd := h.command(rental, 1)
	first := h.mustProvision(cmd)
	for i := range 3 {
		again, err := h.provision(cmd)
		if err != nil {
			h.t.Fatalf("repeat %d of provision %s: %v", i+1, cmd.OperationKey, err)
		}
		if again.NativeRef != first.NativeRef {
			h.t.Errorf("repeat %d answered machine %s, first was %s", i+1, again.NativeRef, first.NativeRef)
		}
		if !again.Duplicate {
			h.t.Errorf("repeat %d of provision %s did not say Duplicate", i+1, cmd.OperationKey)
		}
	}
	if n := h.allocations(rental); n != 1 {
		h.t.Errorf("rental %s: %d machines allocated, want 1", rental, n)
	}

	// A different rental is a different machine.
	other := h.mustProvision(h.command(h.rental(), 1))
	if other.NativeRef == first.NativeRef {
		h.t.Errorf("two rentals share machine %s", first.NativeRef)
	}
}

// checkConcurrentProvision: callers racing with one OperationKey get one
// machine between them.
func checkConcurrentProvision(h *harness) {
	rental := h.rental()
	cmd := h.command(rental, 1)
	const callers = 4
	var wg sync.WaitGroup
	refs := make([]string, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// retry only reads the harness; t is not touched off the test goroutine.
			rec, err := retry(h, func() (capacity.Receipt, error) { return h.p.ProvisionCapacity(h.ctx, cmd) })
			refs[i], errs[i] = rec.NativeRef, err
		}()
	}
	wg.Wait()
	var ref string
	for i := range callers {
		if errs[i] != nil {
			h.t.Errorf("caller %d: %v", i, errs[i])
			continue
		}
		h.cleanup(cmd.Ref(refs[i]))
		if ref == "" {
			ref = refs[i]
		} else if refs[i] != ref {
			h.t.Errorf("caller %d got machine %s, another got %s", i, refs[i], ref)
		}
	}
	if n := h.allocations(rental); n != 1 {
		h.t.Errorf("rental %s: %d machines allocated by %d racing callers, want 1", rental, n, callers)
	}
}

// checkOutOfStock: a provision the provider cannot fill says ErrOutOfStock
// and leaves nothing behind.
func checkOutOfStock(h *harness) {
	if h.o.OutOfStockOfferID == "" {
		h.t.Skip("Options.OutOfStockOfferID not set")
	}
	rental := h.rental()
	cmd := h.command(rental, 1)
	cmd.OfferID = h.o.OutOfStockOfferID
	noRetryStock := *h
	noRetryStock.o.TransientStockOuts = false
	_, err := retry(&noRetryStock, func() (capacity.Receipt, error) { return h.p.ProvisionCapacity(h.ctx, cmd) })
	if !errors.Is(err, capacity.ErrOutOfStock) {
		h.t.Fatalf("provision of %s: got %v, want ErrOutOfStock", cmd.OfferID, err)
	}
	if n := h.allocations(rental); n != 0 {
		h.t.Errorf("out-of-stock provision allocated %d machines", n)
	}
}
