// Package conformance is the test suite every capacity adapter runs: it
// checks that an adapter's declared Support matches what it does, and that
// it keeps the promises the control plane relies on (one OperationKey, one
// machine; only our machines listed; idempotent terminate; generation
// fencing; the bootstrap delivered byte for byte).
//
// An adapter's tests call Run with a constructor for a fresh provider and
// Options naming its test hooks. The suite works against virtual time (an
// Advance hook) or real time (polling), so the same checks serve the fake
// world, an HTTP adapter against an httptest server, and an adapter that
// starts real processes on this host.
package conformance

import (
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// Options tells the suite how to drive and inspect one adapter. Every hook
// receives the provider the suite built, so a hook can reach the world or
// server behind it (type-assert to the adapter's test harness).
type Options struct {
	// OfferID is the offer the suite provisions. Empty: the first available,
	// non-interruptible offer ListCapacity returns.
	OfferID string
	// OutOfStockOfferID, when set, names an offer whose provision must fail
	// with ErrOutOfStock and allocate nothing.
	OutOfStockOfferID string
	// OwnershipToken is the suite's deployment token; "wf-conformance" when
	// empty.
	OwnershipToken string

	// Advance moves the provider's clock forward; it must be safe to call
	// from several goroutines. Nil means the provider runs in real time and
	// the suite sleeps between polls.
	Advance func(p capacity.Provider, d time.Duration)
	// PollInterval is the provider time between two observations while the
	// suite waits for a state: 10s with Advance, 50ms without.
	PollInterval time.Duration
	// Settle bounds how long any transition may take in provider time: 2h
	// with Advance, 30s without.
	Settle time.Duration

	// Received returns the bytes the machine received as its bootstrap. Nil
	// skips the verbatim-bootstrap check.
	Received func(t *testing.T, p capacity.Provider, nativeRef string) ([]byte, bool)
	// Allocations counts, on the provider's side, every machine ever
	// allocated for a rental. Nil falls back to ListOwnedCapacity, which
	// cannot see a second machine that was already terminated.
	Allocations func(t *testing.T, p capacity.Provider, rentalID string) int
	// PlantForeign creates a machine that resembles ours (same rental id)
	// but carries foreignToken, and returns its native ref. Nil skips the
	// look-alike part of the ownership check.
	PlantForeign func(t *testing.T, p capacity.Provider, rentalID, foreignToken string) string

	// Interrupt takes an interruptible machine back as the provider's spot
	// market would. Nil skips the interruption part of the spot check.
	Interrupt func(t *testing.T, p capacity.Provider, nativeRef string)

	// Retries is how often an ambiguous or rate-limited call is retried
	// (the same command, as a real caller would): 8 when zero.
	Retries int
	// TransientStockOuts retries ErrOutOfStock too, for worlds that run out
	// of stock at random.
	TransientStockOuts bool
}

func (o Options) withDefaults() Options {
	if o.OwnershipToken == "" {
		o.OwnershipToken = "wf-conformance"
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 50 * time.Millisecond
		if o.Advance != nil {
			o.PollInterval = 10 * time.Second
		}
	}
	if o.Settle <= 0 {
		o.Settle = 30 * time.Second
		if o.Advance != nil {
			o.Settle = 2 * time.Hour
		}
	}
	if o.Retries <= 0 {
		o.Retries = 8
	}
	return o
}

// Run runs every check as a subtest, each against a fresh provider from
// newProvider.
func Run(t *testing.T, newProvider func(t *testing.T) capacity.Provider, opts Options) {
	t.Helper()
	opts = opts.withDefaults()
	checks := []struct {
		name string
		run  func(h *harness)
	}{
		{"Declaration", checkDeclaration},
		{"Verify", checkVerify},
		{"ListCapacity", checkListCapacity},
		{"Lifecycle", checkLifecycle},
		{"ProvisionIsIdempotent", checkProvisionIdempotent},
		{"ConcurrentProvisionAllocatesOnce", checkConcurrentProvision},
		{"OutOfStock", checkOutOfStock},
		{"ListOwnedReturnsOnlyOurs", checkListOwned},
		{"TerminateIsIdempotent", checkTerminateIdempotent},
		{"StopAndResume", checkStopResume},
		{"GenerationFencing", checkGenerationFencing},
		{"BootstrapVerbatim", checkBootstrapVerbatim},
		{"InvalidCommands", checkInvalid},
		{"Spot", checkSpot},
		{"MaxLifetime", checkMaxLifetime},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t)
			if p == nil {
				t.Fatal("newProvider returned nil")
			}
			c.run(newHarness(t, p, opts))
		})
	}
}
