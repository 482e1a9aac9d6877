package lifecycle

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

func preempt(r schemas.Run) Preemption {
	return Preemption{AttemptID: r.AttemptID, By: "r-9", Why: "priority"}
}

// preemptible is r, declared preemptible.
func preemptible(r schemas.Run) schemas.Run {
	r.Request.Preemptible = true
	return r
}

// attemptEnds are the ways attempt 1 of a Run on n1 can end: any exit,
// a failed start, a failed command, the loss of its node.
// stoppedEnds are attemptEnds but exit 0: an attempt that finished its
// work before a stop took effect succeeds, whatever the stop was for
// (finishedWhileStopping checks that).
func stoppedEnds() map[string]Transition {
	ends := attemptEnds()
	delete(ends, "exit 0")
	return ends
}

// finishedWhileStopping checks that an attempt exiting 0 while the control
// plane stops it succeeds: it is neither run again nor failed late.
func finishedWhileStopping(t *testing.T, stopping schemas.Run) {
	t.Helper()
	got, evs, err := exitOf(1, exitsZero).Apply(stopping)
	if err != nil || got.Phase != schemas.PhaseSucceeded || got.Stopping != "" || got.Preemptions != 0 || len(evs) != 1 {
		t.Errorf("exit 0 while stopping for %s: %s %q %+v %v; want succeeded", stopping.Stopping, got.Phase, got.Reason, evs, err)
	}
}

func attemptEnds() map[string]Transition {
	return map[string]Transition{
		"exit 0":         exitOf(1, exitsZero),
		"exit 1":         exitOf(1, exitsOne),
		"oom":            exitOf(1, oom),
		"failed start":   report(schemas.WorkloadFailed, nil),
		"failed receipt": receiptOf(1, schemas.CodeLaunchFailed),
		"run fault":      receiptOf(1, schemas.CodeRegistryAuthFailed),
		"node lost":      lossOf(1, "", 3),
	}
}

// TestPreemption: a booked attempt that holds its place is marked
// stopping with its grace; however it then ends (but exit 0, when it
// finished first), the Run goes back to
// accepted with reason preempted, Preemptions counted, not a failure (no
// backoff, no retry spent, even under a policy that never retries).
func TestPreemption(t *testing.T) {
	r := preemptible(withRetry(schemas.PhaseRunning, 1, 0, "30s", schemas.RetryOOM))
	r.Retry.MaxAttempts = 1
	r.Request.GraceSeconds = 45
	got, evs, err := preempt(r).Apply(r)
	if err != nil || got.Stopping != schemas.CodePreempted || got.GraceSeconds != 45 || got.Phase != schemas.PhaseRunning || got.CancelRequested {
		t.Fatalf("preempt: %+v %v", got, err)
	}
	if len(evs) != 1 || evs[0].Code != schemas.CodePreempted || evs[0].NodeID != "n1" || !strings.Contains(evs[0].Message, "preempted by run r-9 (priority)") {
		t.Errorf("preempt event %+v", evs)
	}
	if StageOf(got) != StageStopping || StopReason(got) != string(schemas.CodePreempted) {
		t.Errorf("stage %s, stop reason %q", StageOf(got), StopReason(got))
	}
	if g, _, _ := (Preemption{AttemptID: r.AttemptID, GraceSeconds: 5}).Apply(r); g.GraceSeconds != 5 {
		t.Errorf("grace %d, want the given 5", g.GraceSeconds)
	}
	if g, _, _ := preempt(booked(schemas.PhaseRunning)).Apply(preemptible(booked(schemas.PhaseRunning))); g.GraceSeconds != schemas.DefaultGraceSeconds {
		t.Errorf("grace %d, want the default", g.GraceSeconds)
	}
	finishedWhileStopping(t, got)
	for name, end := range stoppedEnds() {
		req, evs, err := end.Apply(got)
		if err != nil || req.Phase != schemas.PhaseAccepted || req.Reason != string(schemas.CodePreempted) || req.Preemptions != 1 ||
			req.Stopping != "" || req.NodeID != "" || req.GPUs != nil || req.WaitCode != "" || !RetryAt(req).IsZero() {
			t.Errorf("%s of a preempted attempt: %+v %v; want requeued preempted", name, req, err)
			continue
		}
		if len(evs) != 1 || evs[0].Code != schemas.CodePreempted || !strings.Contains(evs[0].Message, "does not count against its retries") {
			t.Errorf("%s: events %+v", name, evs)
		}
	}
	// The preempted attempt is not a failure: attempt 2 may still fail
	// once under max_attempts 1 … and no more.
	req, _, _ := exitOf(1, oom).Apply(got)
	req, _, _ = Placement{NodeID: "n2"}.Apply(req)
	second := exitOf(2, oom)
	second.NodeID = "n2"
	if end, _, err := second.Apply(req); err != nil || end.Phase != schemas.PhaseFailed || end.Reason != string(schemas.CodeOOMKilled) {
		t.Errorf("attempt 2 oom under max_attempts 1: %s %s %v, want failed", end.Phase, end.Reason, err)
	}
	req.Retry = &schemas.RetryPolicy{On: []schemas.RetryEvent{schemas.RetryOOM}, MaxAttempts: 2}
	if end, _, err := second.Apply(req); err != nil || end.Phase != schemas.PhaseAccepted {
		t.Errorf("attempt 2 oom under max_attempts 2: %s %v, want retried", end.Phase, err)
	}

	queued := preemptible(booked(schemas.PhasePlaced))
	queued.Queued = true
	cancelling := preemptible(booked(schemas.PhaseRunning))
	cancelling.CancelRequested = true
	for name, r := range map[string]schemas.Run{
		"another attempt": preemptible(withRetry(schemas.PhaseRunning, 2, 0, "")), "accepted": preemptible(booked(schemas.PhaseAccepted)),
		"ended": preemptible(booked(schemas.PhaseSucceeded)), "queued": queued, "cancelling": cancelling, "already stopping": got,
		"not preemptible": booked(schemas.PhaseRunning),
	} {
		if _, evs, err := (Preemption{AttemptID: schemas.WorkloadID("r-1", 1)}).Apply(r); !errors.Is(err, ErrNoChange) || len(evs) != 0 {
			t.Errorf("preempt %s: %v, want no change", name, err)
		}
	}
	if _, _, err := preempt(booked(schemas.PhaseRunning)).Apply(booked(schemas.PhaseRunning)); !errors.Is(err, ErrNotPreemptible) {
		t.Errorf("preempt a Run not preemptible: %v, want ErrNotPreemptible", err)
	}
}

// TestCancelWinsOverStopping: a cancel requested while the control plane
// stops an attempt ends the Run cancelled, however the attempt ends.
func TestCancelWinsOverStopping(t *testing.T) {
	for _, stop := range []Transition{preempt(booked(schemas.PhaseRunning)), DeadlineExceeded{}, BudgetStop{AttemptID: schemas.WorkloadID("r-1", 1)}} {
		stopping, _, err := stop.Apply(preemptible(booked(schemas.PhaseLaunching)))
		if err != nil || stopping.Stopping == "" {
			t.Fatalf("%T: %+v %v", stop, stopping, err)
		}
		c, _, err := Cancellation{Reason: "user"}.Apply(stopping)
		if err != nil || StageOf(c) != StageCancelling || StopReason(c) != string(schemas.CodeCancelled) {
			t.Fatalf("%T then cancel: stage %s reason %q %v", stop, StageOf(c), StopReason(c), err)
		}
		for name, end := range attemptEnds() {
			got, _, err := end.Apply(c)
			if err != nil || got.Phase != schemas.PhaseCancelled || got.Stopping != "" || got.Preemptions != 0 {
				t.Errorf("%T, cancel, %s: %s stopping %q %v; want cancelled", stop, name, got.Phase, got.Stopping, err)
			}
		}
	}
}

// TestDeadlineExceeded: an unbooked or queued Run fails at once; a
// dispatched one is stopped and fails deadline_exceeded however its
// attempt ends; a started, cancelling or stopping Run is past its reach.
func TestDeadlineExceeded(t *testing.T) {
	queued := booked(schemas.PhasePlaced)
	queued.Queued = true
	for name, r := range map[string]schemas.Run{"accepted": booked(schemas.PhaseAccepted), "queued": queued} {
		r.Request.StartDeadlineSeconds = 60
		got, evs, err := DeadlineExceeded{}.Apply(r)
		if err != nil || got.Phase != schemas.PhaseFailed || got.Reason != string(schemas.CodeDeadlineExceeded) || got.Queued || got.GPUs != nil {
			t.Errorf("%s: %+v %v; want failed at once", name, got, err)
		}
		if len(evs) != 1 || evs[0].Code != schemas.CodeDeadlineExceeded || !strings.Contains(evs[0].Message, "start deadline of 60s") {
			t.Errorf("%s: events %+v", name, evs)
		}
	}
	for _, p := range []schemas.Phase{schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching} {
		got, evs, err := DeadlineExceeded{}.Apply(booked(p))
		if err != nil || got.Phase != p || got.Stopping != schemas.CodeDeadlineExceeded || got.GraceSeconds != schemas.DefaultGraceSeconds || len(evs) != 1 {
			t.Fatalf("dispatched %s: %+v %v; want stopping", p, got, err)
		}
		if StopReason(got) != string(schemas.CodeDeadlineExceeded) {
			t.Errorf("stop reason %q", StopReason(got))
		}
		// A report that it started meanwhile does not end the stop.
		if run, _, err := report(schemas.WorkloadRunning, nil).Apply(got); err != nil || run.Stopping != schemas.CodeDeadlineExceeded {
			t.Errorf("running while stopping: %+v %v", run, err)
		}
		finishedWhileStopping(t, got)
		for name, end := range stoppedEnds() {
			e, evs, err := end.Apply(got)
			if err != nil || e.Phase != schemas.PhaseFailed || e.Reason != string(schemas.CodeDeadlineExceeded) || e.Stopping != "" || len(evs) != 1 || evs[0].Code != schemas.CodeDeadlineExceeded {
				t.Errorf("%s, %s: %s %q %+v %v; want failed deadline_exceeded", p, name, e.Phase, e.Reason, evs, err)
			}
		}
	}
	started := booked(schemas.PhaseAccepted)
	started.StartedAt = &time.Time{}
	cancelling := booked(schemas.PhasePlaced)
	cancelling.CancelRequested = true
	stopping, _, _ := preempt(booked(schemas.PhasePlaced)).Apply(preemptible(booked(schemas.PhasePlaced)))
	if stopping.Stopping != schemas.CodePreempted {
		t.Fatal("the preempted Run is not stopping")
	}
	for name, r := range map[string]schemas.Run{
		"running": booked(schemas.PhaseRunning), "started once": started, "cancelling": cancelling, "stopping": stopping, "ended": booked(schemas.PhaseFailed),
	} {
		if _, _, err := (DeadlineExceeded{}).Apply(r); !errors.Is(err, ErrNoChange) {
			t.Errorf("%s: %v, want no change", name, err)
		}
	}
}

// TestBudgetStop: a booked attempt is stopped and its end fails the Run
// budget_exceeded; a queued one fails at once; a waiting Run is left to
// wait.
func TestBudgetStop(t *testing.T) {
	stop := BudgetStop{AttemptID: schemas.WorkloadID("r-1", 1), Why: "spent 512.40 of 500.00 USD"}
	got, evs, err := stop.Apply(booked(schemas.PhaseRunning))
	if err != nil || got.Stopping != schemas.CodeBudgetExceeded || len(evs) != 1 || !strings.Contains(evs[0].Message, "spent 512.40 of 500.00 USD") {
		t.Fatalf("budget stop: %+v %+v %v", got, evs, err)
	}
	finishedWhileStopping(t, got)
	for name, end := range stoppedEnds() {
		if e, _, err := end.Apply(got); err != nil || e.Phase != schemas.PhaseFailed || e.Reason != string(schemas.CodeBudgetExceeded) {
			t.Errorf("%s: %s %q %v; want failed budget_exceeded", name, e.Phase, e.Reason, err)
		}
	}
	queued := booked(schemas.PhasePlaced)
	queued.Queued = true
	if e, _, err := stop.Apply(queued); err != nil || e.Phase != schemas.PhaseFailed || e.Reason != string(schemas.CodeBudgetExceeded) {
		t.Errorf("queued: %s %q %v; want failed at once", e.Phase, e.Reason, err)
	}
	waiting := booked(schemas.PhaseAccepted)
	waiting.AttemptID = stop.AttemptID
	for name, r := range map[string]schemas.Run{"waiting": waiting, "stopping": got, "another attempt": withRetry(schemas.PhaseRunning, 2, 0, "")} {
		if _, _, err := stop.Apply(r); !errors.Is(err, ErrNoChange) {
			t.Errorf("%s: %v, want no change", name, err)
		}
	}
}

// TestDueStopsAndDeadlines: the step a pass owes a Run past its start
// deadline, and one whose stop has gone unanswered.
func TestDueStopsAndDeadlines(t *testing.T) {
	created := time.Unix(1000, 0)
	tm := Timing{RedispatchAfter: 30 * time.Second}
	at := func(p schemas.Phase, mut func(*schemas.Run)) schemas.Run {
		r := booked(p)
		r.CreatedAt, r.PhaseSince, r.Request.StartDeadlineSeconds = created, created, 60
		if mut != nil {
			mut(&r)
		}
		return r
	}
	late, early := created.Add(61*time.Second), created.Add(59*time.Second)
	queued := func(r *schemas.Run) { r.Queued = true }
	backingOff := func(r *schemas.Run) {
		r.Attempt, r.Reason, r.Retry = 1, string(schemas.CodeOOMKilled), &schemas.RetryPolicy{On: []schemas.RetryEvent{schemas.RetryOOM}, MaxAttempts: 3, Backoff: "1h"}
	}
	for _, c := range []struct {
		name string
		r    schemas.Run
		now  time.Time
		want Step
	}{
		{"accepted, in time", at(schemas.PhaseAccepted, nil), early, StepPlace},
		{"accepted, late", at(schemas.PhaseAccepted, nil), late, StepDeadline},
		{"in backoff, late", at(schemas.PhaseAccepted, backingOff), late, StepDeadline},
		{"in backoff, in time", at(schemas.PhaseAccepted, backingOff), early, StepNone},
		{"queued, late", at(schemas.PhasePlaced, queued), late, StepDeadline},
		{"dispatched, late", at(schemas.PhasePreparing, nil), late, StepDeadline},
		{"running, late", at(schemas.PhaseRunning, nil), late, StepNone},
		{"started once, late", at(schemas.PhaseAccepted, func(r *schemas.Run) { r.StartedAt = &created }), late, StepPlace},
		{"no deadline", at(schemas.PhaseAccepted, func(r *schemas.Run) { r.Request.StartDeadlineSeconds = 0 }), late.Add(time.Hour), StepPlace},
		{"cancelling, late", at(schemas.PhaseLaunching, func(r *schemas.Run) { r.CancelRequested = true }), late, StepStop},
		{"stopping, late and stale", at(schemas.PhaseLaunching, func(r *schemas.Run) { r.Stopping = schemas.CodeDeadlineExceeded }), late, StepStop},
		{"stopping, fresh", at(schemas.PhaseRunning, func(r *schemas.Run) { r.Stopping = schemas.CodePreempted }), created.Add(10 * time.Second), StepNone},
		{"stopping, stale", at(schemas.PhaseRunning, func(r *schemas.Run) { r.Stopping = schemas.CodePreempted }), late, StepStop},
	} {
		if got := Due(c.r, 0, c.now, tm); got != c.want {
			t.Errorf("%s (stage %s): %q, want %q", c.name, StageOf(c.r), got, c.want)
		}
	}
	if StopReason(booked(schemas.PhaseRunning)) != "" || StopReason(booked(schemas.PhaseAccepted)) != "" {
		t.Error("a stop reason with no stop under way")
	}
}

// TestWaitCodeAndAttemptRecord: a wait records its code (an unchanged
// answer once); a placement clears it and opens the attempt's record with
// its price.
func TestWaitCodeAndAttemptRecord(t *testing.T) {
	w := Wait{Summary: "quota: gpus(*) 4 of 4", Code: schemas.CodeQuota, Message: "tenant acme is at its quota"}
	r := booked(schemas.PhaseAccepted)
	r.Request.Resources.GPUCount = 2
	got, evs, err := w.Apply(r)
	if err != nil || got.WaitCode != schemas.CodeQuota || len(evs) != 1 || evs[0].Code != schemas.CodeQuota {
		t.Fatalf("wait: %+v %v", got, err)
	}
	if _, _, err := w.Apply(got); !errors.Is(err, ErrNoChange) {
		t.Errorf("the same wait twice: %v", err)
	}
	w.Code = schemas.CodeBudget
	if again, _, err := w.Apply(got); err != nil || again.WaitCode != schemas.CodeBudget {
		t.Errorf("same summary, another code: %q %v", again.WaitCode, err)
	}
	placed, _, err := Placement{NodeID: "n1", PricePerHour: 4.5, GPUModel: "H100"}.Apply(got)
	want := schemas.AttemptRecord{Attempt: 1, NodeID: "n1", GPUs: 2, GPUModel: "H100", PricePerHour: 4.5}
	if err != nil || placed.WaitCode != "" || len(placed.Attempts) != 1 || placed.Attempts[0] != want {
		t.Errorf("placement: wait %q, attempts %+v %v; want %+v", placed.WaitCode, placed.Attempts, err, want)
	}
}
