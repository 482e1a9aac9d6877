package placement

import (
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

func candidate(t *testing.T, cs []schemas.Candidate, id string) schemas.Candidate {
	t.Helper()
	for _, c := range cs {
		if c.NodeID == id {
			return c
		}
	}
	t.Fatalf("no candidate %s", id)
	return schemas.Candidate{}
}

// TestWholeNodePrice: the price is what sends a part-node Run away from a
// whole free node, it shows in that node's cost and detail, and a Run that
// needs the whole node pays nothing.
func TestWholeNodePrice(t *testing.T) {
	s := loadScenario(t, "testdata/scenarios/partly_used_beats_whole_free.json")
	cfg := DefaultConfig()

	fleet, req := s.fleet(t)
	d := Decide(req, fleet, scenarioNow, cfg)
	whole, part := candidate(t, d.Candidates, "a-whole"), candidate(t, d.Candidates, "b-part")
	if d.Winner != "b-part" {
		t.Fatalf("winner %q, want b-part", d.Winner)
	}
	if got := whole.Cost - part.Cost; got != cfg.WholeNodeSeconds {
		t.Errorf("whole node costs %.1fs more than the partly used one, want %.1fs", got, cfg.WholeNodeSeconds)
	}
	if !strings.Contains(whole.Detail, "whole node") || part.Detail != "" {
		t.Errorf("details: whole %q, part %q", whole.Detail, part.Detail)
	}

	off := cfg
	off.WholeNodeSeconds = -1
	fleet, req = s.fleet(t)
	d = Decide(req, fleet, scenarioNow, off)
	whole, part = candidate(t, d.Candidates, "a-whole"), candidate(t, d.Candidates, "b-part")
	if whole.Cost != part.Cost || d.Winner != "b-part" {
		t.Errorf("price off: costs whole %.1f, part %.1f, winner %q; want equal costs, the tie to the fuller b-part", whole.Cost, part.Cost, d.Winner)
	}

	fleet, req = s.fleet(t)
	req.Run.Resources.GPUCount, req.Run.Resources.CPUMillis = 8, 64000
	d = Decide(req, fleet, scenarioNow, cfg)
	whole = candidate(t, d.Candidates, "a-whole")
	if d.Winner != "a-whole" || d.WinnerQueued || whole.Cost != whole.Components.StartSeconds || whole.Detail != "" {
		t.Errorf("8-GPU Run: winner %q queued %v, whole node cost %.1f (start %.1f) detail %q; want it unpriced", d.Winner, d.WinnerQueued, whole.Cost, whole.Components.StartSeconds, whole.Detail)
	}
}

// TestTieGoesToFullerNode: among equal costs the node left with fewer free
// GPUs wins, then the lower id; a lower cost always wins.
func TestTieGoesToFullerNode(t *testing.T) {
	cand := func(id string, cost float64, free int64) *schemas.Candidate {
		return &schemas.Candidate{NodeID: id, Cost: cost, Free: schemas.Resources{GPUCount: free}}
	}
	cases := []struct {
		a, b *schemas.Candidate
		want bool
	}{
		{cand("b", 10, 2), cand("a", 10, 6), true},
		{cand("a", 10, 6), cand("b", 10, 2), false},
		{cand("a", 10, 2), cand("b", 10, 2), true},
		{cand("b", 10, 2), cand("a", 10, 2), false},
		{cand("a", 9, 8), cand("b", 10, 1), true},
	}
	for _, c := range cases {
		if got := better(c.a, c.b); got != c.want {
			t.Errorf("better(%s cost %.0f free %d, %s cost %.0f free %d) = %v, want %v",
				c.a.NodeID, c.a.Cost, c.a.Free.GPUCount, c.b.NodeID, c.b.Cost, c.b.Free.GPUCount, got, c.want)
		}
	}
}
