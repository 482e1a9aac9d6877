package runpod

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// ListCapacity lists, for every gpu type RunPod prices in the configured
// cloud, one on-demand and (where it has a spot price) one interruptible
// offer per configured pod size.
func (p *Provider) ListCapacity(ctx context.Context, q capacity.OfferQuery) ([]capacity.Offer, error) {
	const op = "list_capacity"
	body, err := p.graphql.Call(ctx, op, "", http.MethodPost, "", map[string]string{"query": gpuTypesQuery})
	if err != nil {
		return nil, err
	}
	types, err := decodeGPUTypes(body)
	if err != nil {
		return nil, p.graphql.DecodeError(op, "", err)
	}
	var out []capacity.Offer
	ids := map[string]string{}
	for _, t := range types {
		for _, o := range p.offersOf(t) {
			ids[o.ID] = t.ID
			if q.Matches(o) {
				out = append(out, o)
			}
		}
	}
	p.mu.Lock()
	p.gpuTypes = ids
	p.mu.Unlock()
	return out, nil
}

// offersOf is a gpu type's offers: on-demand and spot, per pod size, at
// the configured cloud's prices (ALL: the lower of the two listed).
func (p *Provider) offersOf(t wireGPUType) []capacity.Offer {
	if t.ID == "" {
		return nil
	}
	onDemand, spot := 0.0, 0.0
	pick := func(ok bool, od, sp float64) {
		if !ok {
			return
		}
		if od > 0 && (onDemand == 0 || od < onDemand) {
			onDemand = od
		}
		if sp > 0 && (spot == 0 || sp < spot) {
			spot = sp
		}
	}
	cloud := strings.ToUpper(p.cfg.CloudType)
	pick(cloud != "COMMUNITY" && t.SecureCloud, t.SecurePrice, t.SecureSpotPrice)
	pick(cloud != "SECURE" && t.CommunityCloud, t.CommunityPrice, t.CommunitySpotPrice)
	var out []capacity.Offer
	for _, n := range p.cfg.GPUCounts {
		base := capacity.Offer{Provider: Type, Region: cloud, GPUModel: t.ID, GPUCount: int64(n), GPUMemoryBytes: gib(t.MemoryInGb),
			CPUMillis: int64(n * p.cfg.VCPUPerGPU * 1000), MemoryBytes: int64(n*p.cfg.MemoryGiBPerGPU) << 30,
			DiskBytes: int64(p.cfg.ContainerDiskGB+p.cfg.VolumeGB) << 30, Available: true}
		if price, ok := micros(onDemand * float64(n)); ok {
			o := base
			o.ID, o.PricePerHour = offerID(t.ID, n, false), capacity.Price{Currency: "USD", MicrosPerHour: price, Exact: true}
			out = append(out, o)
		}
		if price, ok := micros(spot * float64(n)); ok {
			o := base
			o.ID, o.Interruptible = offerID(t.ID, n, true), true
			o.PricePerHour = capacity.Price{Currency: "USD", MicrosPerHour: price, Exact: true}
			out = append(out, o)
		}
	}
	return out
}

// offerID names an offer in printable ASCII without spaces.
func offerID(gpuType string, count int, spot bool) string {
	kind := "od"
	if spot {
		kind = "spot"
	}
	clean := strings.Map(func(r rune) rune {
		if r <= ' ' || r >= 0x7f {
			return '_'
		}
		return r
	}, gpuType)
	return fmt.Sprintf("%dx.%s.%s", count, kind, clean)
}

// gpuTypeOf is the gpu type, count and kind an offer id rents, from the
// last listing (listed again when it is not there).
func (p *Provider) gpuTypeOf(ctx context.Context, id string) (string, int, bool, error) {
	var count int
	var kind string
	if _, err := fmt.Sscanf(id, "%dx.", &count); err != nil || count <= 0 {
		return "", 0, false, fmt.Errorf("offer_id %q is not a runpod offer", id)
	}
	rest := strings.TrimPrefix(id, fmt.Sprintf("%dx.", count))
	kind, _, _ = strings.Cut(rest, ".")
	p.mu.Lock()
	t, ok := p.gpuTypes[id]
	p.mu.Unlock()
	if !ok {
		if _, err := p.ListCapacity(ctx, capacity.OfferQuery{Interruptible: true}); err != nil {
			return "", 0, false, err
		}
		p.mu.Lock()
		t, ok = p.gpuTypes[id]
		p.mu.Unlock()
	}
	if !ok {
		return "", 0, false, fmt.Errorf("offer_id %q is not listed by runpod now", id)
	}
	return t, count, kind == "spot", nil
}

func gib(g float64) int64 {
	if g <= 0 || math.IsNaN(g) || g > 1<<20 {
		return 0
	}
	return int64(g * (1 << 30))
}

// micros converts USD to millionths; false for no price or a nonsense one.
func micros(usd float64) (int64, bool) {
	if !(usd > 0) || usd > 1e6 {
		return 0, false
	}
	return int64(math.Round(usd * 1e6)), true
}
