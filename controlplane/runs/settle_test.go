package runs

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/schemas"
)

// Advance settles the attempts in the write it makes: the booking stamps
// when the attempt began to hold its place, its end stamps, prices and
// tells it once (attempt_ended, numbered after the phase event, in
// WF_EVENTS); the same end again writes and tells nothing.
func TestAdvanceSettlesAttempts(t *testing.T) {
	e := newStoreEnv(t)
	r := e.create(t, "priced")
	t0 := e.now
	placed, err := e.store.Advance(e.ctx, r.ID, lifecycle.Placement{NodeID: "n1", FencingToken: 1, Generation: 1, PricePerHour: 3.6, GPUModel: "H100"}, false)
	if err != nil || len(placed.Attempts) != 1 || placed.Attempts[0].HeldFrom == nil || !placed.Attempts[0].HeldFrom.Equal(t0) {
		t.Fatalf("placed: %+v %v; want its record held from the booking", placed.Attempts, err)
	}
	e.now = t0.Add(time.Hour)
	exit := lifecycle.Report{NodeID: "n1", Workload: schemas.WorkloadObservation{RunID: r.ID, AttemptID: placed.AttemptID, Phase: schemas.WorkloadExited, ExitCode: new(int)}}
	ended, err := e.store.Advance(e.ctx, r.ID, exit, false)
	if err != nil || ended.Phase != schemas.PhaseSucceeded {
		t.Fatalf("exit: %+v %v", ended, err)
	}
	stored, _, err := e.store.Stored(e.ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	a := stored.Attempts[0]
	if a.EndedAt == nil || !a.EndedAt.Equal(t0.Add(time.Hour)) || a.Outcome != "succeeded" || math.Abs(a.CostUSD-3.6) > 1e-9 || math.Abs(stored.CostUSD-3.6) > 1e-9 {
		t.Fatalf("stored record %+v, cost %v; want ended at t0+1h, 3.6 USD", a, stored.CostUSD)
	}
	if len(stored.Outbox) != 2 || stored.Outbox[0].Type != schemas.EventAttemptEnded || stored.Outbox[1].Type != schemas.EventPhase || stored.Outbox[1].Seq != stored.Outbox[0].Seq+1 {
		t.Fatalf("outbox %+v; want attempt_ended, then the terminal phase event numbered after it (a Run's last)", stored.Outbox)
	}
	evs := e.events(t, r.ID)
	var told []schemas.RunEvent
	for _, ev := range evs {
		if ev.Type == schemas.EventAttemptEnded {
			told = append(told, ev)
		}
	}
	if len(told) != 1 || told[0].Usage == nil || told[0].Usage.CostUSD != a.CostUSD || told[0].Usage.GPUModel != "H100" || told[0].RunID != r.ID {
		t.Fatalf("attempt_ended in WF_EVENTS: %+v; want one carrying the record", told)
	}
	if _, err := e.store.Advance(e.ctx, r.ID, exit, true); !errors.Is(err, lifecycle.ErrNoChange) {
		t.Errorf("the exit again: %v, want no change", err)
	}
	if again := e.events(t, r.ID); len(again) != len(evs) {
		t.Errorf("a redelivered exit stored %d more events", len(again)-len(evs))
	}
}
