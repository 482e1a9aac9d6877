package schemas_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestCompactKeepsEveryCandidate: a decision over 10,000 nodes is stored
// with a bounded number of full entries (the winner, the cheapest losers,
// examples of each reason) and every other node named under its reason, so
// invariant 4 holds and the record stays far inside a 1 MB NATS message.
func TestCompactKeepsEveryCandidate(t *testing.T) {
	reasons := []schemas.Code{schemas.ReasonInsufficientGPU, schemas.ReasonLeaseStale, schemas.ReasonNodeDraining}
	d := schemas.BookingDecision{RunID: "r", Attempt: 1, Winner: "n-04242"}
	for i := range 10_000 {
		c := schemas.Candidate{NodeID: fmt.Sprintf("n-%05d", i), Detail: "needs 8 GPUs; node has 4 and a long explanation",
			Free: schemas.Resources{CPUMillis: 64000, MemoryBytes: 512 << 30, GPUCount: 4}}
		switch {
		case i%10 == 0 || c.NodeID == d.Winner:
			c.Eligible, c.Cost, c.Reason = true, float64(10_000-i), schemas.ReasonOutscored
		default:
			c.Reason = reasons[i%len(reasons)]
		}
		if c.NodeID == d.Winner {
			c.Reason = ""
		}
		d.Candidates = append(d.Candidates, c)
	}
	full, _ := json.Marshal(d)
	got := d.Compact(64)
	b, _ := json.Marshal(got)
	if len(got.Candidates) > 64 || len(b) > 256<<10 {
		t.Fatalf("compacted to %d entries, %d bytes (from %d)", len(got.Candidates), len(b), len(full))
	}
	named := map[string]schemas.Code{}
	for _, c := range got.Candidates {
		named[c.NodeID] = c.Reason
	}
	for reason, ids := range got.Others {
		for _, id := range ids {
			if _, dup := named[id]; dup {
				t.Fatalf("%s recorded twice", id)
			}
			named[id] = reason
		}
	}
	for _, c := range d.Candidates {
		if r, ok := named[c.NodeID]; !ok || r != c.Reason {
			t.Fatalf("%s recorded with %q (present %v), want %q", c.NodeID, r, ok, c.Reason)
		}
	}
	if !slices.ContainsFunc(got.Candidates, func(c schemas.Candidate) bool { return c.NodeID == d.Winner && c.Detail != "" }) {
		t.Fatal("winner lost its full entry")
	}
	for _, r := range reasons {
		if !slices.ContainsFunc(got.Candidates, func(c schemas.Candidate) bool { return c.Reason == r }) {
			t.Fatalf("no full example of %s", r)
		}
	}
	// The cheapest losers are the ones kept in full.
	if !slices.ContainsFunc(got.Candidates, func(c schemas.Candidate) bool { return c.NodeID == "n-09990" }) {
		t.Fatal("cheapest eligible loser not kept")
	}
	if small := (schemas.BookingDecision{Candidates: d.Candidates[:10]}).Compact(64); len(small.Candidates) != 10 || small.Others != nil {
		t.Fatal("a decision within the limit was changed")
	}
	t.Logf("10,000 candidates: %d bytes in full, %d compacted", len(full), len(b))
}
