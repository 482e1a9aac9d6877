package controlplane

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// fleetUsage is what the active Runs reserve on each node.
type fleetUsage map[string]nodeUsage

type nodeUsage struct {
	reserved  schemas.Resources
	workloads int
}

// usageOf sums the reservations of Runs booked on nodes and not yet ended.
func usageOf(runs []schemas.Run) fleetUsage {
	u := fleetUsage{}
	for _, r := range runs {
		if r.NodeID == "" || r.Phase.Terminal() || r.Phase == schemas.PhaseAccepted {
			continue
		}
		nu := u[r.NodeID]
		nu.reserved = nu.reserved.Add(r.Request.Resources)
		nu.workloads++
		u[r.NodeID] = nu
	}
	return u
}

// decide chooses a node for run among nodes: every node becomes a Candidate
// with a reason when it cannot or did not win (invariant 4). The score
// prefers the node left with the most headroom, a stand-in until placement
// weighs warmth and price.
func decide(run schemas.Run, nodes []schemas.NodeRecord, usage fleetUsage, now time.Time) schemas.BookingDecision {
	d := schemas.BookingDecision{RunID: run.ID, Attempt: run.Attempt + 1, DecidedAt: now, Candidates: make([]schemas.Candidate, 0, len(nodes))}
	need := run.Request.Resources
	best := -1
	for _, n := range nodes {
		u := usage[n.NodeID]
		free := n.Capacity.Sub(u.reserved)
		c := schemas.Candidate{NodeID: n.NodeID, Free: free}
		switch {
		case n.State != schemas.NodeReady:
			c.Reason, c.Detail = schemas.ReasonNodeNotReady, "node is "+string(n.State)
		case !n.Live(now):
			c.Reason, c.Detail = schemas.ReasonLeaseStale, "no heartbeat since the lease expired at "+n.LeaseExpires.UTC().Format(time.RFC3339)
		case n.MaxWorkloads > 0 && u.workloads >= n.MaxWorkloads:
			c.Reason, c.Detail = schemas.ReasonAtCapacity, fmt.Sprintf("%d of %d workloads running", u.workloads, n.MaxWorkloads)
		case need.GPUCount > free.GPUCount:
			c.Reason, c.Detail = schemas.ReasonInsufficientGPU, fmt.Sprintf("needs %d GPUs, %d free", need.GPUCount, free.GPUCount)
		case need.CPUMillis > free.CPUMillis:
			c.Reason, c.Detail = schemas.ReasonInsufficientCPU, fmt.Sprintf("needs %dm CPU, %dm free", need.CPUMillis, free.CPUMillis)
		case need.MemoryBytes > free.MemoryBytes:
			c.Reason, c.Detail = schemas.ReasonInsufficientMemory, fmt.Sprintf("needs %d bytes of memory, %d free", need.MemoryBytes, free.MemoryBytes)
		default:
			c.Eligible = true
			c.Score = headroom(need, free)
		}
		d.Candidates = append(d.Candidates, c)
	}
	slices.SortFunc(d.Candidates, func(a, b schemas.Candidate) int {
		if a.Eligible != b.Eligible {
			if a.Eligible {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return cmp.Compare(a.NodeID, b.NodeID)
	})
	for i := range d.Candidates {
		c := &d.Candidates[i]
		if !c.Eligible {
			continue
		}
		if best < 0 {
			best = i
			d.Winner = c.NodeID
			continue
		}
		c.Reason, c.Detail = schemas.ReasonOutscored, fmt.Sprintf("score %.3f below the winner's %.3f", c.Score, d.Candidates[best].Score)
	}
	return d
}

// headroom is the mean fraction of each free resource left after booking.
func headroom(need, free schemas.Resources) float64 {
	frac := func(n, f int64) float64 {
		if f <= 0 {
			return 0
		}
		return float64(f-n) / float64(f)
	}
	return (frac(need.CPUMillis, free.CPUMillis) + frac(need.MemoryBytes, free.MemoryBytes)) / 2
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
