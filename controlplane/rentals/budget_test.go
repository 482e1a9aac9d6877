package rentals

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/fake"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// budgetAt is a Budget that allows a tenant up to limit USD more, and
// records what it was asked.
type budgetAt struct {
	limit float64
	mu    sync.Mutex
	asked []float64
}

func (b *budgetAt) Allows(tenant string, expectedUSD float64, _ time.Time) (bool, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked = append(b.asked, expectedUSD)
	if expectedUSD > b.limit {
		return false, "tenant " + tenant + " spent 490.00 of its 500.00 USD budget for day 2026-12-07"
	}
	return true, ""
}

func (b *budgetAt) calls() []float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]float64(nil), b.asked...)
}

// inviter mints a bootstrap naming the node alone.
type inviter struct{}

func (inviter) Invite(_ context.Context, req schemas.InviteRequest) (schemas.NodeBootstrap, error) {
	return schemas.NodeBootstrap{NodeID: req.NodeID}, nil
}

// budgetManager is a leading rental manager over a provider with one offer
// at 2 USD an hour, asking budget.
func budgetManager(t *testing.T, budget Budget) (*Manager, *fake.Provider) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn := testenv.ProvisionedBus(t, "rentals-budget")
	p, err := fake.New(fake.Config{Offers: []capacity.Offer{{ID: "x1", Provider: "fake", GPUModel: "H100", GPUCount: 1, CPUMillis: 8000,
		MemoryBytes: 64 << 30, PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: 2_000_000}, Available: true}}})
	if err != nil {
		t.Fatal(err)
	}
	rentalsKV, err := conn.JS.KeyValue(ctx, bus.BucketRentals)
	if err != nil {
		t.Fatal(err)
	}
	nodesKV, err := conn.JS.KeyValue(ctx, bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t)
	m, err := New(Config{Provider: p, OwnershipToken: "own", Budget: budget, MaxRentals: 4}, placement.DefaultConfig(), conn, rentalsKV, nodesKV,
		cache.New(), nil, inviter{}, time.Now, log)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	if err := m.store.start(ctx, &wg); err != nil {
		t.Fatal(err)
	}
	lease, err := openLeaderLease(ctx, conn, 5*time.Second, log)
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { lease.run(ctx) })
	waitFor(t, 5*time.Second, "the lease", lease.leading)
	m.leader.Store(lease)
	return m, p
}

// The rent-or-queue policy counts a rental's expected cost (the offer's
// price × the Run's max runtime, else placement's UnknownRuntime) against
// the tenant's budget before renting: refused, RentFor answers a budget
// refusal naming why and nothing is rented; RentBeforeQueueing books the
// queue.
func TestRentalsCountExpectedCostAgainstBudget(t *testing.T) {
	budget := &budgetAt{limit: 15}
	m, p := budgetManager(t, budget)
	ctx := context.Background()
	gpu := schemas.Resources{GPUCount: 1, CPUMillis: 1000, MemoryBytes: 1 << 30}
	long := schemas.Run{ID: "r-long", Tenant: "acme", Request: schemas.RunRequest{Resources: gpu, MaxRuntimeSeconds: 10 * 3600}}

	coming, _, err := m.RentFor(ctx, long)
	var ref *schemas.Refusal
	if coming || !errors.As(err, &ref) || ref.Code != schemas.CodeBudget || !strings.Contains(ref.Reason, "tenant acme spent 490.00 of its 500.00") {
		t.Fatalf("a 20 USD rental past a 15 USD allowance: coming %v, %v", coming, err)
	}
	if got := budget.calls(); len(got) != 2 || got[0] != 0 || got[1] != 20 {
		t.Errorf("asked the budget %v, want 0 (before any provider call) then 20 (2 USD/h × 10 h)", got)
	}
	if n := len(p.Allocations()); n != 0 || len(m.store.list()) != 0 {
		t.Fatalf("refused, yet %d machines allocated, %d rentals recorded", n, len(m.store.list()))
	}
	d := schemas.BookingDecision{Candidates: []schemas.Candidate{candidate("busy", true, 3600, 3600, "cold", 1<<20)}}
	if rent, err := m.RentBeforeQueueing(ctx, long, d); rent || err != nil {
		t.Fatalf("past its budget, RentBeforeQueueing: rent %v, %v; want the queue", rent, err)
	}
	if n := len(p.Allocations()); n != 0 {
		t.Fatalf("%d machines allocated for a queue", n)
	}

	// No max runtime: placement's UnknownRuntime (10 minutes) at 2 USD/h.
	short := schemas.Run{ID: "r-short", Tenant: "acme", Request: schemas.RunRequest{Resources: gpu}}
	coming, renting, err := m.RentFor(ctx, short)
	if !coming || err != nil || !strings.Contains(renting, "rental") {
		t.Fatalf("a rental within the budget: coming %v %q, %v", coming, renting, err)
	}
	if got := budget.calls(); len(got) != 6 || got[5] < 0.333 || got[5] > 0.334 {
		t.Errorf("asked the budget %v, want 1/3 USD last", got)
	}
	if n := len(p.Allocations()); n != 1 {
		t.Errorf("%d machines allocated, want the one allowed", n)
	}

	// A tenant already past its budget is refused before offers are listed.
	over := &budgetAt{limit: -1}
	m2, _ := budgetManager(t, over)
	if _, _, err := m2.RentFor(ctx, short); !errors.Is(err, &schemas.Refusal{Code: schemas.CodeBudget}) {
		t.Fatalf("past its budget: %v", err)
	}
	if got := over.calls(); len(got) != 1 || got[0] != 0 {
		t.Errorf("asked %v, want once, for nothing more", got)
	}
}
