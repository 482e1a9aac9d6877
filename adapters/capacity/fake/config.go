package fake

import (
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// Config shapes one fake world. The zero Config is a well-behaved provider
// that supports everything, with no faults, on a ManualClock at a fixed epoch.
type Config struct {
	// Seed drives every random choice; one seed and one sequence of calls
	// give one outcome.
	Seed uint64
	// Clock is the world's time; a ManualClock at a fixed epoch when nil.
	Clock Clock
	// Support is what the world promises and does; DefaultSupport when nil.
	Support *capacity.Support
	// Offers is the catalogue; DefaultOffers when nil.
	Offers []capacity.Offer
	// ConnectionID is stamped on owned capacity.
	ConnectionID string
	// RejectCredentials makes every call fail with ErrUnauthorized.
	RejectCredentials bool
	Latency           Latency
	Faults            Faults
}

// Latency is virtual: it moves state timelines and, on an Advancer clock,
// the clock itself. Nothing sleeps.
type Latency struct {
	// Call is how long each API call takes (advances an Advancer clock).
	Call time.Duration
	// Provision is accepted → booting; Boot is booting → running.
	Provision time.Duration
	Boot      time.Duration
	// Stop is stopping → stopped; Start is stopped → running.
	Stop  time.Duration
	Start time.Duration
	// Terminate is terminating → terminated.
	Terminate time.Duration
	// Jitter scales each latency by a factor drawn from [1-Jitter, 1+Jitter].
	Jitter float64
}

// DefaultLatency is a provider that takes minutes, not hours.
func DefaultLatency() Latency {
	return Latency{
		Call:      50 * time.Millisecond,
		Provision: 40 * time.Second,
		Boot:      30 * time.Second,
		Stop:      20 * time.Second,
		Start:     30 * time.Second,
		Terminate: 15 * time.Second,
		Jitter:    0.2,
	}
}

// Faults are probabilities in [0,1], each drawn per call from the seed.
type Faults struct {
	// StockOut refuses a provision with ErrOutOfStock (nothing allocated).
	StockOut float64
	// LostResponse applies a mutating call and then answers
	// ErrResponseLost, as if the response never arrived.
	LostResponse float64
	// DuplicateDelivery delivers a provision to the provider twice (a
	// transport retry); the answer is the second delivery's.
	DuplicateDelivery float64
	// SpotInterruption reclaims an interruptible machine at a random moment
	// within SpotInterruptWithin of it starting to run.
	SpotInterruption    float64
	SpotInterruptWithin time.Duration
	// RateLimit refuses a call with ErrRateLimited carrying RetryAfter.
	RateLimit  float64
	RetryAfter time.Duration
}

// DefaultSupport is everything a provider can promise.
func DefaultSupport() capacity.Support {
	return capacity.Support{
		Stop: true, Resume: true, PersistentDisk: true, Spot: true, ExactPricing: true,
		IdempotentProvision: capacity.IdempotencyOperationKey, ListOwned: true,
		ObserveAfterTerminate: true, GenerationFencing: true, MaxLifetime: true,
	}
}

// DefaultOffers is a small catalogue: two on-demand GPU shapes, a spot
// shape, and one shape that is always out of stock.
func DefaultOffers() []capacity.Offer {
	usd := func(cents int64, exact bool) capacity.Price {
		return capacity.Price{Currency: "USD", MicrosPerHour: cents * capacity.MicrosPerCent, Exact: exact}
	}
	return []capacity.Offer{
		{ID: "fake-a100x1", Provider: "fake", Region: "fake-east", GPUModel: "A100", GPUCount: 1, GPUMemoryBytes: 80 << 30,
			CPUMillis: 16000, MemoryBytes: 128 << 30, DiskBytes: 512 << 30, PricePerHour: usd(180, true), Available: true},
		{ID: "fake-h100x8", Provider: "fake", Region: "fake-east", GPUModel: "H100", GPUCount: 8, GPUMemoryBytes: 80 << 30,
			CPUMillis: 192000, MemoryBytes: 2048 << 30, DiskBytes: 8192 << 30, PricePerHour: usd(2400, true), Available: true},
		{ID: "fake-a100x1-spot", Provider: "fake", Region: "fake-west", GPUModel: "A100", GPUCount: 1, GPUMemoryBytes: 80 << 30,
			CPUMillis: 16000, MemoryBytes: 128 << 30, DiskBytes: 512 << 30, PricePerHour: usd(70, true), Interruptible: true, InterruptionRate: 0.05, Available: true},
		{ID: "fake-b200x8", Provider: "fake", Region: "fake-west", GPUModel: "B200", GPUCount: 8, GPUMemoryBytes: 192 << 30,
			CPUMillis: 224000, MemoryBytes: 2048 << 30, DiskBytes: 8192 << 30, PricePerHour: usd(4000, true), Available: false},
	}
}
