package lifecycle

import (
	"math"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// step applies t to r and settles it at now, as runs.Store.Advance does,
// returning the attempt_ended events.
func step(t *testing.T, r schemas.Run, in Transition, now time.Time) (schemas.Run, []schemas.RunEvent) {
	t.Helper()
	got, _, err := in.Apply(r)
	if err != nil {
		t.Fatalf("%T: %v", in, err)
	}
	return got, Settle(&got, now)
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestSettle: a queued attempt holds nothing until it leaves the queue;
// an ended attempt is stamped, priced by the hours it held its place and
// told by one attempt_ended event carrying its record; a retry's attempts
// add up in the Run's cost; settling again changes nothing.
func TestSettle(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	r := schemas.Run{ID: "r-1", Phase: schemas.PhaseAccepted, Retry: &schemas.RetryPolicy{On: []schemas.RetryEvent{schemas.RetryOOM}, MaxAttempts: 3}}
	r.Request.Resources.GPUCount = 1
	r, evs := step(t, r, Placement{NodeID: "n1", Queued: true, PricePerHour: 3, GPUModel: "H100"}, t0)
	if len(evs) != 0 || len(r.Attempts) != 1 || r.Attempts[0].HeldFrom != nil {
		t.Fatalf("queued: %+v %+v; want a record not yet held", r.Attempts, evs)
	}
	r, evs = step(t, r, QueueStart{AttemptID: "r-1-a1", GPUs: []string{"GPU-a"}}, t0.Add(time.Hour))
	if len(evs) != 0 || r.Attempts[0].HeldFrom == nil || !r.Attempts[0].HeldFrom.Equal(t0.Add(time.Hour)) {
		t.Fatalf("out of the queue: %+v; want held from t0+1h", r.Attempts[0])
	}
	before := r
	if again := Settle(&r, t0.Add(90*time.Minute)); len(again) != 0 || !r.Attempts[0].HeldFrom.Equal(t0.Add(time.Hour)) {
		t.Errorf("settling a held attempt again: %+v %+v", again, r.Attempts[0])
	}
	r, evs = step(t, r, exitOf(1, oom), t0.Add(3*time.Hour))
	a := r.Attempts[0]
	if len(evs) != 1 || evs[0].Type != schemas.EventAttemptEnded || evs[0].Usage == nil || evs[0].Attempt != 1 || evs[0].NodeID != "n1" {
		t.Fatalf("oom: events %+v; want one attempt_ended", evs)
	}
	if a.EndedAt == nil || !a.EndedAt.Equal(t0.Add(3*time.Hour)) || a.Outcome != schemas.CodeOOMKilled || !near(a.CostUSD, 6) || !near(r.CostUSD, 6) {
		t.Fatalf("oom record %+v, run cost %v; want 2h at 3 USD/h, oom_killed", a, r.CostUSD)
	}
	if u := *evs[0].Usage; u.Outcome != a.Outcome || u.CostUSD != a.CostUSD || !u.HeldFrom.Equal(*a.HeldFrom) || !u.EndedAt.Equal(*a.EndedAt) || u.GPUModel != "H100" || u.GPUs != 1 {
		t.Errorf("usage %+v is not the record %+v", u, a)
	}
	if before.Attempts[0].EndedAt != nil {
		t.Error("Settle changed the records of the Run a transition was given")
	}
	if again := Settle(&r, t0.Add(4*time.Hour)); len(again) != 0 || !near(r.CostUSD, 6) {
		t.Errorf("an ended attempt ended again: %+v, cost %v", again, r.CostUSD)
	}

	// The retry is booked at once: held from its booking.
	r, _ = step(t, r, Placement{NodeID: "n2", PricePerHour: 2}, t0.Add(4*time.Hour))
	done := exitOf(2, exitsZero)
	done.NodeID = "n2"
	r, evs = step(t, r, done, t0.Add(4*time.Hour+30*time.Minute))
	if len(evs) != 1 || evs[0].Attempt != 2 || r.Attempts[1].Outcome != "succeeded" || !near(r.Attempts[1].CostUSD, 1) || !near(r.CostUSD, 7) {
		t.Fatalf("retry: %+v, cost %v; want attempt 2 succeeded at 1 USD, 7 in all", r.Attempts, r.CostUSD)
	}
}

// TestSettleOutcomes: an attempt that never held its place costs nothing;
// the outcome is the Run's reason, preempted for a preempted one,
// cancelled for a cancelled one.
func TestSettleOutcomes(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	place := func(queued bool) schemas.Run {
		r, _ := step(t, preemptible(schemas.Run{ID: "r-1", Phase: schemas.PhaseAccepted}), Placement{NodeID: "n1", Queued: queued, PricePerHour: 10}, t0)
		return r
	}
	r, evs := step(t, place(true), DeadlineExceeded{}, t0.Add(time.Hour))
	if a := r.Attempts[0]; len(evs) != 1 || a.HeldFrom != nil || a.CostUSD != 0 || a.Outcome != schemas.CodeDeadlineExceeded || r.CostUSD != 0 {
		t.Errorf("queued attempt failed by its deadline: %+v %+v; want cost 0", a, evs)
	}
	running := place(false)
	stopping, _ := step(t, running, preempt(running), t0.Add(time.Hour))
	r, evs = step(t, stopping, exitOf(1, exitsOne), t0.Add(90*time.Minute))
	if a := r.Attempts[0]; len(evs) != 1 || a.Outcome != schemas.CodePreempted || !near(a.CostUSD, 15) {
		t.Errorf("preempted: %+v; want outcome preempted, 1.5h at 10 USD/h", a)
	}
	cancelling, _ := step(t, running, Cancellation{}, t0.Add(time.Minute))
	r, evs = step(t, cancelling, lossOf(1, "", 3), t0.Add(6*time.Minute))
	if a := r.Attempts[0]; len(evs) != 1 || a.Outcome != schemas.CodeCancelled || !near(a.CostUSD, 1) {
		t.Errorf("cancelled: %+v; want outcome cancelled, 6m at 10 USD/h", a)
	}
	r, evs = step(t, running, lossOf(1, "", 1), t0.Add(time.Hour))
	if a := r.Attempts[0]; len(evs) != 1 || a.Outcome != schemas.CodeAttemptsExhausted || r.Phase != schemas.PhaseLost {
		t.Errorf("lost: %+v %s", a, r.Phase)
	}
}

// TestPlacementBoundsAttemptRecords: past schemas.MaxAttemptRecords the
// oldest ended records go, the Run's cost stays, the Run the transition
// was given keeps its records, and an open record is never dropped.
func TestPlacementBoundsAttemptRecords(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	r := schemas.Run{ID: "r-1", Phase: schemas.PhaseAccepted, CostUSD: 64, Attempt: schemas.MaxAttemptRecords, Preemptions: schemas.MaxAttemptRecords}
	for i := 1; i <= schemas.MaxAttemptRecords; i++ {
		ended := t0.Add(time.Duration(i) * time.Minute)
		r.Attempts = append(r.Attempts, schemas.AttemptRecord{Attempt: i, NodeID: "n1", EndedAt: &ended, Outcome: schemas.CodePreempted, CostUSD: 1})
	}
	got, _, err := Placement{NodeID: "n2"}.Apply(r)
	if err != nil {
		t.Fatal(err)
	}
	n := len(got.Attempts)
	if n != schemas.MaxAttemptRecords || got.Attempts[0].Attempt != 2 || got.Attempts[n-1].Attempt != schemas.MaxAttemptRecords+1 || got.Attempts[n-1].NodeID != "n2" {
		t.Fatalf("%d records, first %d, last %+v; want %d, 2..%d", n, got.Attempts[0].Attempt, got.Attempts[n-1], schemas.MaxAttemptRecords, schemas.MaxAttemptRecords+1)
	}
	if got.CostUSD != 64 || len(r.Attempts) != schemas.MaxAttemptRecords || r.Attempts[0].Attempt != 1 {
		t.Fatalf("cost %v, given Run's records %d from %d; want 64 and untouched", got.CostUSD, len(r.Attempts), r.Attempts[0].Attempt)
	}
	r.Attempts[0].EndedAt = nil // an open record: kept whatever the count
	if got, _, _ = (Placement{NodeID: "n2"}).Apply(r); len(got.Attempts) != schemas.MaxAttemptRecords+1 || got.Attempts[0].Attempt != 1 {
		t.Fatalf("open first record: %d records from %d; want it kept", len(got.Attempts), got.Attempts[0].Attempt)
	}
}
