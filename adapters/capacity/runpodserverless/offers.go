package runpodserverless

import (
	"context"
	"math"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
)

// ListOffers lists the configured endpoints that run q's image and fit
// it, each with its expected start from its health: at once when a worker
// is idle, else a cold start behind what is queued there.
func (e *Executor) ListOffers(ctx context.Context, q ephemeral.OfferQuery) ([]ephemeral.Offer, error) {
	var out []ephemeral.Offer
	for _, ep := range e.endpoints {
		o := offerOf(ep)
		if !q.Matches(o) {
			continue
		}
		h, err := e.health(ctx, "list_offers", ep.ID)
		if err != nil {
			return nil, err
		}
		o.ReadySeconds = readySeconds(ep, h)
		out = append(out, o)
	}
	return out, nil
}

// offerOf is an endpoint as an offer.
func offerOf(ep Endpoint) ephemeral.Offer {
	micros := int64(0)
	if p := ep.USDPerSecond * 3600 * 1e6; p > 0 && p < math.MaxInt64/2 {
		micros = int64(math.Round(p))
	}
	return ephemeral.Offer{Image: ep.Image, MaxRuntimeSeconds: ep.MaxRuntimeSeconds, Offer: capacity.Offer{
		ID: ep.ID, Provider: Type, GPUModel: ep.GPUModel, GPUCount: ep.GPUCount, CPUMillis: ep.CPUMillis, MemoryBytes: ep.MemoryBytes,
		Available: true, PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: micros, Exact: true}}}
}

// readySeconds estimates when a job sent now starts: 1s with an idle
// worker and nothing queued, else a cold start plus one more for every
// job already waiting.
func readySeconds(ep Endpoint, h wireHealth) int64 {
	cold := ep.ColdStartSeconds
	if cold <= 0 {
		cold = 30
	}
	queued := int64(max(h.Jobs.InQueue, 0))
	if h.Workers.Idle > 0 && queued == 0 {
		return 1
	}
	return cold + min(queued, 10_000)
}
