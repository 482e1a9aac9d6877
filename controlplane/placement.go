package controlplane

import (
	"cmp"
	"slices"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// snapshot builds the fleet as placement sees it: every node with the Runs
// booked on it, running ones and queued ones in booking order. Indexing is
// placement.NewFleet's job; this only groups bookings by node.
func (cp *ControlPlane) snapshot(runs []schemas.Run, now time.Time) *placement.Fleet {
	booked := map[string][]schemas.Run{}
	for _, r := range runs {
		if r.NodeID != "" && !r.Phase.Terminal() && r.Phase != schemas.PhaseAccepted {
			booked[r.NodeID] = append(booked[r.NodeID], r)
		}
	}
	recs := cp.cache.nodeList()
	nodes := make([]*placement.Node, 0, len(recs))
	for _, rec := range recs {
		n := placement.NewNode(rec)
		rs := booked[rec.NodeID]
		slices.SortFunc(rs, func(a, b schemas.Run) int { return cmp.Compare(a.PhaseSince.UnixNano(), b.PhaseSince.UnixNano()) })
		for _, r := range rs {
			b := placement.Booking{RunID: r.ID, Resources: r.Request.Resources, ExpectedEnd: cp.expectedEnd(r, now)}
			if r.Queued {
				n.Queued = append(n.Queued, b)
			} else {
				n.Running = append(n.Running, b)
			}
		}
		nodes = append(nodes, n)
	}
	return placement.NewFleet(nodes)
}

// expectedEnd is when a booking should free its place.
func (cp *ControlPlane) expectedEnd(r schemas.Run, now time.Time) time.Time {
	start := r.PhaseSince
	if r.StartedAt != nil {
		start = *r.StartedAt
	}
	if r.Queued || start.IsZero() {
		start = now
	}
	if r.Request.MaxRuntimeSeconds > 0 {
		return start.Add(time.Duration(r.Request.MaxRuntimeSeconds) * time.Second)
	}
	return start.Add(cp.cfg.Placement.UnknownRuntime)
}

// permanent reports whether a rejection holds whatever the node's current
// load: the node can never run this request as it is.
func permanent(code schemas.Code) bool {
	switch code {
	case schemas.ReasonInsufficientCPU, schemas.ReasonInsufficientMemory, schemas.ReasonInsufficientGPU,
		schemas.ReasonInsufficientDisk, schemas.ReasonGPUModelMismatch, schemas.ReasonDriverMissing,
		schemas.ReasonDriverTooOld, schemas.ReasonPlatformMismatch:
		return true
	}
	return false
}

// unsatisfiable reports whether every node rejects the Run for a reason
// that waiting will not change.
func unsatisfiable(d schemas.BookingDecision) bool {
	if len(d.Candidates) == 0 {
		return false // no nodes yet: one may enroll
	}
	for _, c := range d.Candidates {
		if c.Eligible || !permanent(c.Reason) {
			return false
		}
	}
	return true
}

// waitingSummary condenses an unwinnable decision so an unchanged one is not
// recorded again on every scheduling pass.
func waitingSummary(d schemas.BookingDecision) string {
	if len(d.Candidates) == 0 {
		return "no nodes enrolled"
	}
	s := ""
	for _, c := range d.Candidates {
		s += c.NodeID + "=" + string(c.Reason) + ";"
	}
	return s
}
