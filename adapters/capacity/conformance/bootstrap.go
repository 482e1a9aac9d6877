package conformance

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// checkBootstrapVerbatim: the machine receives the bootstrap's JSON byte
// for byte, including characters that break naive shell quoting.
func checkBootstrapVerbatim(h *harness) {
	if h.o.Received == nil {
		h.t.Skip("Options.Received not set: the adapter exposes no test hook for what a machine received")
	}
	cmd := h.command(h.rental(), 1)
	want, err := json.Marshal(cmd.Bootstrap)
	if err != nil {
		h.t.Fatal(err)
	}
	rec := h.mustProvision(cmd)
	got, ok := h.o.Received(h.t, h.p, rec.NativeRef)
	if !ok {
		h.t.Fatalf("machine %s received no bootstrap", rec.NativeRef)
	}
	if !bytes.Equal(got, want) {
		h.t.Errorf("machine %s received\n%q\nwant\n%q", rec.NativeRef, got, want)
	}
	// A duplicate answer must not have re-delivered anything different.
	if _, err := h.provision(cmd); err != nil {
		h.t.Fatalf("repeat provision: %v", err)
	}
	if again, _ := h.o.Received(h.t, h.p, rec.NativeRef); !bytes.Equal(again, want) {
		h.t.Errorf("after a duplicate provision machine %s holds %q", rec.NativeRef, again)
	}
}

// checkInvalid: malformed commands are refused with ErrInvalid and
// allocate nothing.
func checkInvalid(h *harness) {
	rental := h.rental()
	base := h.command(rental, 1)
	bad := map[string]func(c *capacity.ProvisionCommand){
		"no rental":          func(c *capacity.ProvisionCommand) { c.RentalID = "" },
		"no operation key":   func(c *capacity.ProvisionCommand) { c.OperationKey = "" },
		"no ownership token": func(c *capacity.ProvisionCommand) { c.OwnershipToken = "" },
		"generation zero":    func(c *capacity.ProvisionCommand) { c.Generation = 0 },
		"no offer":           func(c *capacity.ProvisionCommand) { c.OfferID = "" },
		"negative lifetime":  func(c *capacity.ProvisionCommand) { c.MaxLifetimeSeconds = -1 },
	}
	for name, mutate := range bad {
		c := base
		mutate(&c)
		_, err := h.p.ProvisionCapacity(h.ctx, c)
		h.wantCode("provision with "+name, err, capacity.ErrInvalid)
	}
	if n := h.allocations(rental); n != 0 {
		h.t.Errorf("invalid provisions allocated %d machines", n)
	}

	_, err := h.p.ObserveCapacity(h.ctx, capacity.Ref{OwnershipToken: h.o.OwnershipToken})
	h.wantCode("observe without a native ref", err, capacity.ErrInvalid)
	_, err = h.p.TerminateCapacity(h.ctx, capacity.Command{Ref: capacity.Ref{NativeRef: "x"}, Generation: 1})
	h.wantCode("terminate without an ownership token", err, capacity.ErrInvalid)
	_, err = h.p.ListOwnedCapacity(h.ctx, capacity.OwnershipQuery{})
	if !errors.Is(err, capacity.ErrInvalid) && !errors.Is(err, capacity.ErrUnsupported) {
		h.t.Errorf("list owned without a token: got %v, want ErrInvalid (or ErrUnsupported)", err)
	}
}
