package capacity

import (
	"strings"

	"github.com/warmfleet/warmfleet/schemas"
)

// Offer is one kind of machine a provider will rent, where, and at what
// rate. Quantities use the units of schemas.Resources so placement compares
// an offer and a node with the same arithmetic.
type Offer struct {
	// ID is what ProvisionCommand.OfferID names; stable for this provider.
	ID string `json:"id"`
	// Provider is the adapter type that lists the offer.
	Provider string `json:"provider"`
	// Cloud is the upstream cloud when Provider is a marketplace.
	Cloud  string `json:"cloud,omitempty"`
	Region string `json:"region,omitempty"`
	// GPUModel is the provider's name for the card ("H100", "A100_80G").
	GPUModel string `json:"gpu_model,omitempty"`
	GPUCount int64  `json:"gpu_count"`
	// GPUMemoryBytes is per card.
	GPUMemoryBytes int64 `json:"gpu_memory_bytes,omitempty"`
	CPUMillis      int64 `json:"cpu_millis"`
	MemoryBytes    int64 `json:"memory_bytes"`
	DiskBytes      int64 `json:"disk_bytes,omitempty"`
	PricePerHour   Price `json:"price_per_hour"`
	Interruptible  bool  `json:"interruptible,omitempty"`
	// InterruptionRate is the provider's stated chance, in [0,1], that an
	// interruptible machine of this offer is taken back within an hour;
	// 0 when it states none.
	InterruptionRate float64 `json:"interruption_rate,omitempty"`
	// Available is the provider's claim that it has stock now. It is a hint:
	// a provision can still run out of stock.
	Available bool `json:"available"`
	// ReadySeconds is the provider's estimate of how long a provision of
	// this offer takes to reach running (allocation plus boot), zero when it
	// gives none. It is an estimate, for weighing a rental against a queue,
	// never a measurement.
	ReadySeconds int64 `json:"ready_seconds,omitempty"`
}

// OfferQuery narrows ListCapacity. The zero query lists everything.
type OfferQuery struct {
	// Resources are minimums an offer must meet.
	Resources schemas.Resources `json:"resources,omitzero"`
	// GPU narrows the card model and memory.
	GPU *schemas.GPURequirement `json:"gpu,omitempty"`
	// Region, when set, must equal the offer's region.
	Region string `json:"region,omitempty"`
	// Interruptible includes spot offers; by default only on-demand ones.
	Interruptible bool `json:"interruptible,omitempty"`
	// AvailableOnly drops offers the provider says are out of stock.
	AvailableOnly bool `json:"available_only,omitempty"`
}

// Matches reports whether o satisfies q. Adapters filter with it so every
// provider reads a query the same way.
func (q OfferQuery) Matches(o Offer) bool {
	r := q.Resources
	if o.GPUCount < r.GPUCount || o.CPUMillis < r.CPUMillis || o.MemoryBytes < r.MemoryBytes {
		return false
	}
	if r.DiskBytes > 0 && o.DiskBytes > 0 && o.DiskBytes < r.DiskBytes {
		return false
	}
	if q.Region != "" && o.Region != q.Region {
		return false
	}
	if o.Interruptible && !q.Interruptible {
		return false
	}
	if q.AvailableOnly && !o.Available {
		return false
	}
	if g := q.GPU; g != nil {
		if g.Model != "" && !strings.Contains(strings.ToLower(o.GPUModel), strings.ToLower(g.Model)) {
			return false
		}
		if g.MinMemoryBytes > 0 && o.GPUMemoryBytes < g.MinMemoryBytes {
			return false
		}
	}
	return true
}
