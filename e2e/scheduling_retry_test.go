package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_RetryPolicy: a Run retried on oom is killed for memory on
// its first node; it goes back to accepted with reason oom_killed and is
// placed on the other node, the decision recording the penalty of the node
// it failed on, and succeeds there: one Run id, one event log, two
// attempts. A Run whose retry.on lacks oom ends failed oom_killed after
// its one attempt.
func TestAcceptance_RetryPolicy(t *testing.T) {
	f := newFleet(t, withPolicy(t, schemas.SchedulingPolicy{}))
	first := f.startNoopNode(noopNodeSpec{id: "oom-a"})

	// The workload runs long enough for the second node to enroll, then is
	// killed for memory on oom-a only.
	req := noopRun("oom-retried", map[string]string{noopruntime.EnvExitAfter: "6s", noopruntime.EnvOOMOn: first.id})
	req.Retry = &schemas.RetryPolicy{On: []schemas.RetryEvent{schemas.RetryOOM}, MaxAttempts: 2}
	id := f.submit(req)
	r1 := f.waitPhase(id, schemas.PhaseRunning, 30*time.Second)
	if r1.NodeID != first.id {
		t.Fatalf("first attempt on %s, want %s", r1.NodeID, first.id)
	}
	f.startNoopNode(noopNodeSpec{id: "oom-b"})
	if r, _ := f.run(id); r.Phase != schemas.PhaseRunning || r.Attempt != 1 {
		t.Fatalf("the first attempt ended (%s, attempt %d) before oom-b enrolled: the retry would have had one node to go to", r.Phase, r.Attempt)
	}

	done := f.waitPhase(id, schemas.PhaseSucceeded, 45*time.Second)
	if done.NodeID != "oom-b" || done.Attempt != 2 {
		t.Fatalf("the Run succeeded on %s in attempt %d, want oom-b in attempt 2", done.NodeID, done.Attempt)
	}
	if len(done.Attempts) != 2 || done.Attempts[0].NodeID != first.id || done.Attempts[0].Outcome != schemas.CodeOOMKilled ||
		done.Attempts[1].NodeID != "oom-b" || done.Attempts[1].Outcome != "succeeded" {
		t.Errorf("attempt records %+v; want oom_killed on oom-a, then succeeded on oom-b", done.Attempts)
	}
	evs := f.events(id)
	if back := requeued(evs, schemas.CodeOOMKilled); len(back) != 1 || back[0].Attempt != 1 || back[0].NodeID != first.id {
		t.Errorf("requeue events %+v; want one from attempt 1 on oom-a with code oom_killed", back)
	}
	// The retry's decision penalises oom-a and names why.
	var retry *schemas.BookingDecision
	for _, ev := range evs {
		if ev.RunID != id {
			t.Errorf("event of another Run in %s's log: %+v", id, ev)
		}
		if ev.Decided() && ev.Decision != nil && ev.Decision.Winner != "" && ev.Decision.Attempt == 2 {
			retry = ev.Decision
		}
	}
	if retry == nil {
		t.Fatalf("no decision booked the second attempt; events %+v", evs)
	}
	a, b := candidate(retry, first.id), candidate(retry, "oom-b")
	if retry.Winner != "oom-b" || a.Components.PenaltySeconds <= 0 || !strings.Contains(a.Detail, string(schemas.ReasonPenalised)) || b.Components.PenaltySeconds != 0 {
		t.Errorf("retry decision: winner %s, oom-a %+v, oom-b %+v; want oom-a penalised (penalty seconds and detail), oom-b not", retry.Winner, a, b)
	}

	// Without oom in retry.on, the kill ends the Run.
	req = noopRun("oom-final", map[string]string{noopruntime.EnvOOM: "1", noopruntime.EnvExitAfter: "200ms"})
	req.Retry = &schemas.RetryPolicy{On: []schemas.RetryEvent{schemas.RetryExitNonZero, schemas.RetryNodeLost}, MaxAttempts: 3}
	final := f.waitPhase(f.submit(req), "", 30*time.Second)
	if final.Phase != schemas.PhaseFailed || final.Reason != string(schemas.CodeOOMKilled) || final.Attempt != 1 || len(final.Attempts) != 1 {
		t.Errorf("Run not retried on oom ended %s (%s) after %d attempts (%+v); want failed oom_killed after one", final.Phase, final.Reason, final.Attempt, final.Attempts)
	}
	if back := requeued(f.events(final.ID), schemas.CodeOOMKilled); len(back) != 0 {
		t.Errorf("Run not retried on oom was requeued: %+v", back)
	}
}
