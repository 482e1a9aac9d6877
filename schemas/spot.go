package schemas

import (
	"cmp"
	"time"
)

// SpotPolicy says whether a Run may run on interruptible (spot) capacity:
// rented machines a provider may take back at short notice for a lower
// price.
type SpotPolicy string

const (
	// SpotDefault (empty) is the tenant's policy, else SpotNever.
	SpotDefault SpotPolicy = ""
	// SpotNever: on-demand capacity only; never placed on an
	// interruptible node.
	SpotNever SpotPolicy = "never"
	// SpotAllowed: spot and on-demand offers are compared on expected
	// start and expected cost; on-demand is the fallback when no spot
	// offer serves (none listed, or its region or type is penalised after
	// an interruption).
	SpotAllowed SpotPolicy = "allowed"
	// SpotOnly: interruptible capacity only; the Run waits rather than
	// fall back to on-demand.
	SpotOnly SpotPolicy = "only"
)

// SpotPolicies lists the policies a request or a tenant may name.
var SpotPolicies = []SpotPolicy{SpotNever, SpotAllowed, SpotOnly}

// Valid reports whether p is empty or one of SpotPolicies.
func (p SpotPolicy) Valid() bool {
	switch p {
	case SpotDefault, SpotNever, SpotAllowed, SpotOnly:
		return true
	}
	return false
}

// AllowsSpot reports whether interruptible capacity may take the Run.
func (p SpotPolicy) AllowsSpot() bool { return p == SpotAllowed || p == SpotOnly }

// AllowsOnDemand reports whether on-demand capacity may take the Run.
func (p SpotPolicy) AllowsOnDemand() bool { return p != SpotOnly }

// CodeInvalidSpot refuses a spot policy that is none of SpotPolicies.
const CodeInvalidSpot Code = "invalid_spot"

// ReasonSpotNotAllowed: the node is interruptible and the Run's spot policy
// is never; ReasonOnDemandNotAllowed the reverse (policy only).
// ReasonNodeInterrupting: the node reported that its provider is taking it
// back.
const (
	ReasonSpotNotAllowed     Code = "spot_not_allowed"
	ReasonOnDemandNotAllowed Code = "on_demand_not_allowed"
	ReasonNodeInterrupting   Code = "node_interrupting"
)

// InterruptionNotice is a node's own report that its provider will take
// the machine back: the time the provider announced (zero when it gave
// none) and where the agent read it.
type InterruptionNotice struct {
	// At is when the machine is to be reclaimed, by the provider's notice.
	At time.Time `json:"at,omitzero"`
	// Source is what the agent watched: "file" or "url".
	Source string `json:"source"`
	// Detail is the notice's text, cut to MaxNoticeBytes.
	Detail string `json:"detail,omitempty"`
}

// MaxNoticeBytes bounds an InterruptionNotice's Detail.
const MaxNoticeBytes = 512

// Validate checks a notice's source and size.
func (n *InterruptionNotice) Validate() error {
	if n.Source != "file" && n.Source != "url" {
		return refuse(CodeMalformed, "interruption.source", "is file or url")
	}
	if len(n.Detail) > MaxNoticeBytes {
		return refuse(CodeValueTooLong, "interruption.detail", "at most %d bytes", MaxNoticeBytes)
	}
	return nil
}

// CapacityKind names capacity that is, or is not, interruptible: spot or
// on-demand.
func CapacityKind(interruptible bool) string {
	if interruptible {
		return "spot"
	}
	return "on-demand"
}

// PoolName names a pool of capacity, its region and card, as operators
// read it.
func PoolName(region, gpuModel string) string {
	return cmp.Or(region, "any region") + ", " + cmp.Or(gpuModel, "no GPU")
}
