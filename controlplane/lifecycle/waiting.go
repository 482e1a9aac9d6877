package lifecycle

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/warmfleet/warmfleet/schemas"
)

// The two reasons an accepted Run waits, each built here once: no node
// takes it now (NoNodeFits), or every node that fits is busy and a rental
// starts it sooner than their queues (ForRental).

// NoNodeFits is the Wait of a Run no node takes now, d's winner empty.
// renting, when not empty, names the capacity on its way for the Run (a
// rental and its stage); each stage it passes is then one event.
func NoNodeFits(d schemas.BookingDecision, renting string) Wait {
	w := Wait{Decision: d, Summary: waitingSummary(d), Code: schemas.CodeNoCapacity, Message: "no node fits now; waiting"}
	if renting != "" {
		w.Summary += " " + renting
		w.Message += " for capacity: " + renting
	}
	return w
}

// ForRental is the Wait of a Run whose decision d would queue it on a busy
// node, for rental rentalID instead, which starts it sooner (why says by
// how much). The decision then has no winner, and every eligible (busy)
// node is marked with why it lost.
func ForRental(d schemas.BookingDecision, rentalID, why string) Wait {
	d.Winner, d.WinnerQueued = "", false
	d.Candidates = slices.Clone(d.Candidates)
	for i := range d.Candidates {
		if c := &d.Candidates[i]; c.Eligible {
			c.Reason, c.Detail = schemas.CodeRentBeatsQueue, fmt.Sprintf("busy: starts it in %.0fs; rental %s is sooner", c.Components.StartSeconds, rentalID)
		}
	}
	return Wait{Decision: d, Summary: "rental " + rentalID, Code: schemas.CodeRentBeatsQueue, Message: why + " (rental " + rentalID + ")"}
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
