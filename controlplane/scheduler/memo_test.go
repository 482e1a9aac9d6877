package scheduler

import (
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// The fleet key moves with what placement reads (the node set, every
// booking) and with nothing else: not the order Runs come in, nor Runs
// still waiting.
func TestFleetKey(t *testing.T) {
	m := newDecisionMemo()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := &schemas.Run{ID: "a", NodeID: "n1", Phase: schemas.PhaseRunning, PhaseSince: at}
	b := &schemas.Run{ID: "b", NodeID: "n1", Phase: schemas.PhasePlaced, Queued: true, PhaseSince: at}
	waiting := &schemas.Run{ID: "w", Phase: schemas.PhaseAccepted, Waiting: "no nodes enrolled"}
	key := m.fleetKey(1, []*schemas.Run{a, b})
	if m.fleetKey(1, []*schemas.Run{b, waiting, a}) != key {
		t.Error("the key changed with the Runs' order or a waiting Run")
	}
	for name, change := range map[string]func(r *schemas.Run){
		"phase":       func(r *schemas.Run) { r.Phase = schemas.PhasePreparing },
		"node":        func(r *schemas.Run) { r.NodeID = "n2" },
		"queued":      func(r *schemas.Run) { r.Queued = false },
		"phase since": func(r *schemas.Run) { r.PhaseSince = at.Add(time.Second) },
	} {
		c := *b
		change(&c)
		if m.fleetKey(1, []*schemas.Run{a, &c}) == key {
			t.Errorf("the key ignores a booking's %s", name)
		}
	}
	if m.fleetKey(2, []*schemas.Run{a, b}) == key {
		t.Error("the key ignores the node set's version")
	}
}

// A waiting Run decided against a fleet is skipped while the fleet is the
// same and the decision recent; a Run not seen in a pass is forgotten.
func TestDecisionMemo(t *testing.T) {
	m := newDecisionMemo()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &schemas.Run{ID: "r", Phase: schemas.PhaseAccepted, Waiting: "n1=queue_full;"}
	if m.fresh(r, 7, now) {
		t.Fatal("a Run never decided is fresh")
	}
	m.decided(r.ID, 7, now)
	m.endPass()
	switch {
	case !m.fresh(r, 7, now.Add(time.Second)):
		t.Error("a Run decided a second ago against the same fleet is not fresh")
	case m.fresh(r, 8, now.Add(time.Second)):
		t.Error("a Run is fresh against another fleet")
	case m.fresh(r, 7, now.Add(memoMaxAge)):
		t.Error("a Run is fresh past memoMaxAge")
	case m.fresh(&schemas.Run{ID: "r", Phase: schemas.PhaseAccepted}, 7, now):
		t.Error("a Run with no waiting answer recorded is fresh")
	}
	m.endPass() // fresh carried r into this pass
	if !m.fresh(r, 7, now.Add(2*time.Second)) {
		t.Error("a skipped Run was dropped from the memo")
	}
	m.endPass()
	m.endPass() // a pass that did not see r
	if m.fresh(r, 7, now.Add(3*time.Second)) {
		t.Error("a Run not seen in the last pass is still fresh")
	}
}
