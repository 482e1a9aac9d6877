package lifecycle

import (
	"fmt"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

func decisionOf(cands ...schemas.Candidate) schemas.BookingDecision {
	return schemas.BookingDecision{RunID: "r-1", Attempt: 1, Candidates: cands}
}

func TestNoNodeFits(t *testing.T) {
	gpu := schemas.Candidate{NodeID: "n1", Reason: schemas.ReasonInsufficientGPU}
	busy := schemas.Candidate{NodeID: "n2", Reason: schemas.ReasonQueueFull}
	many := make([]schemas.Candidate, maxNamedInSummary+1)
	for i := range many {
		many[i] = schemas.Candidate{NodeID: fmt.Sprintf("n%02d", i), Reason: schemas.ReasonInsufficientGPU}
	}
	many[3].Reason, many[5].Reason = schemas.ReasonNodeDraining, schemas.ReasonFactsStale
	for _, tc := range []struct {
		name         string
		d            schemas.BookingDecision
		renting      string
		summary, msg string
	}{
		{"no nodes", decisionOf(), "", "no nodes enrolled", "no node fits now; waiting"},
		{"few nodes by name", decisionOf(gpu, busy), "", "n1=insufficient_gpu;n2=queue_full;", "no node fits now; waiting"},
		{"a rental on its way", decisionOf(gpu), "rental rt-1 is booting",
			"n1=insufficient_gpu; rental rt-1 is booting", "no node fits now; waiting for capacity: rental rt-1 is booting"},
		// Past maxNamedInSummary nodes, reasons are counted, most first,
		// ties by name.
		{"many nodes by reason", decisionOf(many...), "",
			"17 nodes: insufficient_gpu=15 facts_stale=1 node_draining=1", "no node fits now; waiting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := NoNodeFits(tc.d, tc.renting)
			if w.Summary != tc.summary || w.Message != tc.msg || w.Code != schemas.CodeNoCapacity {
				t.Fatalf("got summary %q, message %q, code %s; want %q, %q, %s", w.Summary, w.Message, w.Code, tc.summary, tc.msg, schemas.CodeNoCapacity)
			}
			r, evs, err := w.Apply(booked(schemas.PhaseAccepted))
			if err != nil || r.Waiting != tc.summary || len(evs) != 1 || evs[0].Decision == nil || len(evs[0].Decision.Candidates) != len(tc.d.Candidates) {
				t.Fatalf("applied: waiting %q, events %+v, %v", r.Waiting, evs, err)
			}
		})
	}
}

// A Run waits for a rental with a decision that names no winner and says,
// on every busy node, that the rental is sooner; the decision it was given
// is left as it was.
func TestForRental(t *testing.T) {
	d := decisionOf(
		schemas.Candidate{NodeID: "busy", Eligible: true, Components: schemas.ScoreComponents{StartSeconds: 600, QueueSeconds: 600}},
		schemas.Candidate{NodeID: "small", Reason: schemas.ReasonInsufficientGPU, Detail: "needs 8 GPUs; node has 1"},
	)
	d.Winner, d.WinnerQueued = "busy", true
	w := ForRental(d, "rt-7", "every node that fits is busy")
	if w.Summary != "rental rt-7" || w.Code != schemas.CodeRentBeatsQueue || w.Message != "every node that fits is busy (rental rt-7)" {
		t.Fatalf("wait: %+v", w)
	}
	got := w.Decision
	if got.Winner != "" || got.WinnerQueued {
		t.Errorf("a Run waiting for a rental has no winner: %+v", got)
	}
	if c := got.Candidates[0]; c.Reason != schemas.CodeRentBeatsQueue || !strings.Contains(c.Detail, "starts it in 600s; rental rt-7 is sooner") {
		t.Errorf("the busy node says why it lost: %+v", c)
	}
	if c := got.Candidates[1]; c.Reason != schemas.ReasonInsufficientGPU || c.Detail != "needs 8 GPUs; node has 1" {
		t.Errorf("a node refused for its own reason keeps it: %+v", c)
	}
	if d.Winner != "busy" || d.Candidates[0].Reason != "" {
		t.Errorf("the caller's decision was changed: %+v", d)
	}
}
