package fakeexec_test

import (
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral/execconformance"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral/fakeexec"
)

const image = "registry.example/worker@sha256:1111111111111111111111111111111111111111111111111111111111111111"

func offers() []ephemeral.Offer {
	return []ephemeral.Offer{{Image: image, Offer: capacity.Offer{ID: "pool-a", Provider: fakeexec.Type, GPUModel: "A100", GPUCount: 1,
		CPUMillis: 8000, MemoryBytes: 32 << 30, Available: true, ReadySeconds: 5, PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: 900_000, Exact: true}}}}
}

func TestConformance(t *testing.T) {
	execconformance.Run(t, func(*testing.T) ephemeral.Executor {
		return fakeexec.New(fakeexec.Config{Offers: offers(), QueueFor: 20 * time.Millisecond, RunFor: 50 * time.Millisecond})
	}, execconformance.Options{
		Query:          ephemeral.OfferQuery{Image: image},
		Hold:           func(_ *testing.T, e ephemeral.Executor, on bool) { e.(*fakeexec.Executor).Hold(on) },
		LoseNextLaunch: func(_ *testing.T, e ephemeral.Executor) { e.(*fakeexec.Executor).LoseNextLaunch(1) },
		Launches:       func(_ *testing.T, e ephemeral.Executor) int { return e.(*fakeexec.Executor).Launches() },
	})
}
