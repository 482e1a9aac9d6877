package scheduler

import (
	"cmp"
	"maps"
	"slices"
	"strconv"

	"github.com/warmfleet/warmfleet/schemas"
)

// permanent reports whether a rejection holds whatever the node's current
// load: the node can never run this request as it is.
func permanent(code schemas.Code) bool {
	switch code {
	case schemas.ReasonInsufficientCPU, schemas.ReasonInsufficientMemory, schemas.ReasonInsufficientGPU,
		schemas.ReasonInsufficientDisk, schemas.ReasonGPUModelMismatch, schemas.ReasonGPUNotInjectable, schemas.ReasonDriverMissing,
		schemas.ReasonDriverTooOld, schemas.ReasonPlatformMismatch, schemas.ReasonNetworkUnavailable, schemas.ReasonCacheMountsUnsupported:
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
// recorded again on every scheduling pass: the nodes by name while there
// are few, else the count of each reason (a per-node list over thousands
// of nodes would make every waiting Run's record huge).
func waitingSummary(d schemas.BookingDecision) string {
	if len(d.Candidates) == 0 {
		return "no nodes enrolled"
	}
	if len(d.Candidates) <= maxNamedInSummary {
		s := ""
		for _, c := range d.Candidates {
			s += c.NodeID + "=" + string(c.Reason) + ";"
		}
		return s
	}
	counts := map[schemas.Code]int{}
	for _, c := range d.Candidates {
		counts[c.Reason]++
	}
	reasons := slices.SortedFunc(maps.Keys(counts), func(a, b schemas.Code) int {
		return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b))
	})
	s := strconv.Itoa(len(d.Candidates)) + " nodes:"
	for _, r := range reasons {
		s += " " + string(r) + "=" + strconv.Itoa(counts[r])
	}
	return s
}

// maxNamedInSummary is the largest fleet whose waiting summary names nodes.
const maxNamedInSummary = 16

// msgNoNodeFits is the message of a decision that leaves a Run waiting.
const msgNoNodeFits = "no node fits now; waiting"
