package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/fake"
	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/schemas"
)

// switchable is a provider an operator's outage can take down: while down,
// its check and its listing fail as an unreachable API's do.
type switchable struct {
	capacity.Provider
	down atomic.Bool
}

var errAPIDown = errors.New("provider API unreachable")

func (s *switchable) Verify(ctx context.Context) error {
	if s.down.Load() {
		return errAPIDown
	}
	return s.Provider.Verify(ctx)
}

func (s *switchable) ListCapacity(ctx context.Context, q capacity.OfferQuery) ([]capacity.Offer, error) {
	if s.down.Load() {
		return nil, errAPIDown
	}
	return s.Provider.ListCapacity(ctx, q)
}

// connections asks the control plane how its provider connections stand.
func (f *fleet) connections() []schemas.ConnectionStatus {
	f.t.Helper()
	b, _ := json.Marshal(schemas.AdminRequest{})
	msg, err := f.conn.NC.Request(bus.SubjectConnections, b, 5*time.Second)
	if err != nil {
		f.t.Fatal(err)
	}
	var rep schemas.Reply[[]schemas.ConnectionStatus]
	if err := json.Unmarshal(msg.Data, &rep); err != nil || rep.OK == nil {
		f.t.Fatalf("connections reply %s: %v", msg.Data, err)
	}
	return *rep.OK
}

// TestAcceptance_TwoProviders: one control plane rents through several
// provider connections. Offers are compared across them: of two local
// connections, the one whose offer starts sooner at the lower price wins,
// and the rental records its connection. A third connection, the
// cheapest of all, fails its check (its credentials are refused): it is
// shown failed, its offers are never listed, and the others serve. Then
// the winner's API goes down: the next Run is rented through the one left.
func TestAcceptance_TwoProviders(t *testing.T) {
	w := newWorld(t)
	var f *fleet
	usd := func(micros int64) capacity.Price {
		return capacity.Price{Currency: "USD", MicrosPerHour: micros, Exact: true}
	}
	launch := func(ctx context.Context, name string, boot schemas.NodeBootstrap) (local.Machine, error) {
		return f.localLauncher(t)(ctx, name, boot)
	}
	cheapLocal := local.New(launch, capacity.Offer{ID: "cheap-2c", CPUMillis: 2000, MemoryBytes: 4 << 30, ReadySeconds: 20, PricePerHour: usd(500_000)})
	cheap := &switchable{Provider: cheapLocal}
	dear := local.New(launch, capacity.Offer{ID: "dear-2c", CPUMillis: 2000, MemoryBytes: 4 << 30, ReadySeconds: 90, PricePerHour: usd(2_000_000)})
	down, err := fake.New(fake.Config{RejectCredentials: true, Offers: []capacity.Offer{{ID: "down-2c", Provider: "fake", CPUMillis: 2000, MemoryBytes: 4 << 30,
		ReadySeconds: 1, PricePerHour: usd(10_000), Available: true}}})
	if err != nil {
		t.Fatal(err)
	}
	f = newFleet(t, invitedOnly, func(c *controlplane.Config) {
		c.Capacity = &rentals.Config{Connections: []rentals.Connection{
			{ID: "dear", Provider: dear, OwnershipToken: "wf-dear"},
			{ID: "cheap", Provider: cheap, OwnershipToken: "wf-cheap", MaxRentals: 1},
			{ID: "down", Provider: down, OwnershipToken: "wf-down"},
		}, MaxRentals: 3, IdleTimeout: time.Minute, Interval: 200 * time.Millisecond}
	})

	id := f.submit(schemas.RunRequest{RequestID: "two-1", Image: w.image.Reference, Command: []string{"true"}})
	r := f.waitPhase(id, schemas.PhaseSucceeded, 90*time.Second)
	rs := f.rentals()
	if len(rs) != 1 || rs[0].NodeID != r.NodeID || rs[0].ConnectionID != "cheap" || rs[0].OwnershipToken != "wf-cheap" || rs[0].OfferID != "cheap-2c" {
		t.Fatalf("rentals %+v: want one, of connection cheap, for the run on %s", rs, r.NodeID)
	}
	if !strings.Contains(rs[0].Why, "connection cheap") {
		t.Errorf("the rental does not say how it was chosen: %q", rs[0].Why)
	}
	if cheapLocal.Launched() != 1 || dear.Launched() != 0 || len(down.Allocations()) != 0 {
		t.Fatalf("launched: cheap %d, dear %d, down %d", cheapLocal.Launched(), dear.Launched(), len(down.Allocations()))
	}
	byID := map[string]schemas.ConnectionStatus{}
	for _, c := range f.connections() {
		byID[c.ID] = c
	}
	if c := byID["down"]; c.State != schemas.ConnectionFailed || c.Type != "fake" || !strings.Contains(c.Error, "unauthorized") {
		t.Errorf("connection down: %+v; want failed, with why", c)
	}
	if c := byID["cheap"]; c.State != schemas.ConnectionOK || c.Live != 1 || c.MaxRentals != 1 {
		t.Errorf("connection cheap: %+v", c)
	}
	if c := byID["dear"]; c.State != schemas.ConnectionOK || c.Live != 0 {
		t.Errorf("connection dear: %+v", c)
	}

	// The winner's machine is retired and its API goes down: the next Run
	// is rented through dear, and nothing more through cheap.
	f.adminRetire(rs[0].RentalID)
	f.eventually(30*time.Second, "the cheap rental to end", func() bool {
		for _, rt := range f.rentals() {
			if rt.RentalID == rs[0].RentalID {
				return rt.State.Done()
			}
		}
		return false
	})
	cheap.down.Store(true)
	id2 := f.submit(schemas.RunRequest{RequestID: "two-2", Image: w.image.Reference, Command: []string{"true"}})
	r2 := f.waitPhase(id2, schemas.PhaseSucceeded, 90*time.Second)
	for _, rt := range f.rentals() {
		if rt.NodeID == r2.NodeID && rt.ConnectionID != "dear" {
			t.Fatalf("with cheap down the run was rented through %s: %+v", rt.ConnectionID, rt)
		}
	}
	if cheapLocal.Launched() != 1 || dear.Launched() != 1 {
		t.Fatalf("launched: cheap %d, dear %d; want 1 and 1", cheapLocal.Launched(), dear.Launched())
	}
}

// adminRetire asks for a rental to be retired (wf.admin.rental.retire).
func (f *fleet) adminRetire(rentalID string) {
	f.t.Helper()
	b, _ := json.Marshal(schemas.AdminRequest{ID: rentalID})
	msg, err := f.conn.NC.Request(bus.SubjectRetire, b, 5*time.Second)
	if err != nil {
		f.t.Fatal(err)
	}
	var rep schemas.Reply[schemas.Rental]
	if err := json.Unmarshal(msg.Data, &rep); err != nil || rep.OK == nil {
		f.t.Fatalf("retire %s: %s %v", rentalID, msg.Data, err)
	}
}
