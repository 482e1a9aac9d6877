package usage

import (
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/schemas"
)

// Price is what an attempt holding res (gpus of them cards of model) on
// node n costs per hour, USD: its share of the node's own price (by cards
// when it holds any, else by CPU), or, on a node with no price, the
// policy's owned rate for model × its cards.
func Price(n schemas.NodeRecord, res schemas.Resources, model string, pol *policy.Snapshot) float64 {
	if n.PricePerHour > 0 {
		switch {
		case res.GPUCount > 0 && n.Capacity.GPUCount > 0:
			return n.PricePerHour * float64(res.GPUCount) / float64(n.Capacity.GPUCount)
		case n.Capacity.CPUMillis > 0:
			return n.PricePerHour * float64(res.CPUMillis) / float64(n.Capacity.CPUMillis)
		}
		return n.PricePerHour
	}
	if pol == nil || res.GPUCount == 0 {
		return 0
	}
	return pol.OwnedRate(model) * float64(res.GPUCount)
}
