package fake_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/conformance"
	"github.com/warmfleet/warmfleet/adapters/capacity/fake"
)

// hooks reach the fake world behind the provider the suite built.
var hooks = conformance.Options{
	OutOfStockOfferID: "fake-b200x8",
	Advance:           func(p capacity.Provider, d time.Duration) { p.(*fake.Provider).Advance(d) },
	Received: func(_ *testing.T, p capacity.Provider, ref string) ([]byte, bool) {
		return p.(*fake.Provider).Received(ref)
	},
	Allocations: func(_ *testing.T, p capacity.Provider, rental string) int {
		return p.(*fake.Provider).AllocationCount(rental)
	},
	PlantForeign: func(_ *testing.T, p capacity.Provider, rental, token string) string {
		return p.(*fake.Provider).PlantForeign(rental, token)
	},
	Interrupt: func(_ *testing.T, p capacity.Provider, ref string) {
		p.(*fake.Provider).Interrupt(ref)
	},
	TransientStockOuts: true,
	Retries:            24,
}

// minimal is a provider that promises as little as a provider can.
var minimal = capacity.Support{IdempotentProvision: capacity.IdempotencyNone, ListOwned: true}

var faulty = fake.Faults{
	StockOut: 0.1, LostResponse: 0.25, DuplicateDelivery: 0.25, RateLimit: 0.1, RetryAfter: 3 * time.Second,
	SpotInterruption: 0.5, SpotInterruptWithin: 30 * time.Minute,
}

func TestConformance(t *testing.T) {
	worlds := []struct {
		name    string
		support *capacity.Support
		faults  fake.Faults
	}{
		{"full", nil, fake.Faults{}},
		{"full-faulty", nil, faulty},
		{"minimal", &minimal, fake.Faults{}},
		{"minimal-faulty", &minimal, faulty},
	}
	for _, w := range worlds {
		for _, seed := range []uint64{1, 2, 3} {
			t.Run(fmt.Sprintf("%s/seed=%d", w.name, seed), func(t *testing.T) {
				t.Parallel()
				conformance.Run(t, func(t *testing.T) capacity.Provider {
					p, err := fake.New(fake.Config{Seed: seed, Support: w.support, Latency: fake.DefaultLatency(), Faults: w.faults})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() {
						if d := p.DoubleAllocations(); len(d) > 0 {
							t.Errorf("operation keys allocated twice: %v", d)
						}
					})
					return p
				}, hooks)
			})
		}
	}
}
