package lifecycle

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// withRetry is a Run booked on n1 in phase p, attempt n (preemptions of
// them preempted), under policy on.
func withRetry(p schemas.Phase, n, preempted int, backoff string, on ...schemas.RetryEvent) schemas.Run {
	r := booked(p)
	r.Attempt, r.AttemptID, r.Preemptions = n, schemas.WorkloadID("r-1", n), preempted
	r.GPUs = []string{"GPU-a"}
	if on != nil {
		r.Retry = &schemas.RetryPolicy{On: on, MaxAttempts: 3, Backoff: backoff}
	}
	return r
}

// exitOf reports attempt n's end on n1.
func exitOf(n int, mut func(*schemas.WorkloadObservation)) Report {
	return report(schemas.WorkloadExited, func(w *schemas.WorkloadObservation) {
		w.AttemptID = schemas.WorkloadID("r-1", n)
		mut(w)
	})
}

func oom(w *schemas.WorkloadObservation)       { w.ExitCode, w.OOMKilled = intp(137), true }
func exitsOne(w *schemas.WorkloadObservation)  { w.ExitCode = intp(1) }
func exitsZero(w *schemas.WorkloadObservation) { w.ExitCode = intp(0) }

func receiptOf(n int, code schemas.Code) ReceiptFailure {
	return ReceiptFailure{NodeID: "n1", Receipt: schemas.OperationReceipt{AttemptID: schemas.WorkloadID("r-1", n), Kind: schemas.CmdLaunchWorkload,
		Outcome: schemas.OutcomeFailed, Code: code, Message: "no such binary"}}
}

func lossOf(n int, cause schemas.Code, max int) Loss {
	return Loss{AttemptID: schemas.WorkloadID("r-1", n), Why: "node n1 stopped heartbeating", MaxAttempts: max, Cause: cause}
}

// TestRetryPolicy: an attempt ending in a way its Run's policy lists goes
// back to accepted while fewer than max_attempts attempts failed
// (preempted ones not counted), its node and cards freed, with one event
// telling what failed where, which retry, after what backoff, and the
// penalty; an ending not listed, a run fault, a cancel or max_runtime ends
// the Run; spent retries end it with the attempt's code (a loss keeps
// attempts_exhausted). Without a policy only node loss and interruption
// are retried, up to the loss limit.
func TestRetryPolicy(t *testing.T) {
	oomOnly := []schemas.RetryEvent{schemas.RetryOOM}
	all := []schemas.RetryEvent{schemas.RetryExitNonZero, schemas.RetryOOM, schemas.RetryNodeLost, schemas.RetryInterrupted, schemas.RetryLaunchFailed}
	cancel := withRetry(schemas.PhaseRunning, 1, 0, "", all...)
	cancel.CancelRequested = true
	cases := []struct {
		name   string
		r      schemas.Run
		in     Transition
		phase  schemas.Phase
		reason schemas.Code
		code   schemas.Code // the event's
		msg    []string
	}{
		{"oom retried after its backoff", withRetry(schemas.PhaseRunning, 1, 0, "30s", oomOnly...), exitOf(1, oom), schemas.PhaseAccepted, schemas.CodeOOMKilled, schemas.CodeOOMKilled,
			[]string{"attempt 1 on n1: killed by the kernel", "retry 1 of 2 after a backoff of 30s", "penalises node n1"}},
		{"second retry doubles the backoff", withRetry(schemas.PhaseRunning, 2, 0, "30s", oomOnly...), exitOf(2, oom), schemas.PhaseAccepted, schemas.CodeOOMKilled, schemas.CodeOOMKilled,
			[]string{"retry 2 of 2 after a backoff of 1m0s"}},
		{"retry without backoff", withRetry(schemas.PhasePreparing, 1, 0, "", all...), exitOf(1, exitsOne), schemas.PhaseAccepted, schemas.CodeExitNonZero, schemas.CodeExitNonZero,
			[]string{"exited non-zero", "retry 1 of 2, placed again at once"}},
		{"spent", withRetry(schemas.PhaseRunning, 3, 0, "30s", oomOnly...), exitOf(3, oom), schemas.PhaseFailed, schemas.CodeOOMKilled, schemas.CodeOOMKilled,
			[]string{"no retry left (3 of 3 attempts failed)"}},
		{"preemptions do not count", withRetry(schemas.PhaseRunning, 3, 1, "", oomOnly...), exitOf(3, oom), schemas.PhaseAccepted, schemas.CodeOOMKilled, schemas.CodeOOMKilled,
			[]string{"retry 2 of 2"}},
		{"exit not listed", withRetry(schemas.PhaseRunning, 1, 0, "", oomOnly...), exitOf(1, exitsOne), schemas.PhaseFailed, schemas.CodeExitNonZero, schemas.CodeExitNonZero, nil},
		{"exit 0", withRetry(schemas.PhaseRunning, 1, 0, "", all...), exitOf(1, exitsZero), schemas.PhaseSucceeded, "", "", nil},
		{"max runtime never", withRetry(schemas.PhaseRunning, 1, 0, "", all...),
			exitOf(1, func(w *schemas.WorkloadObservation) { exitsOne(w); w.StopReason = string(schemas.CodeMaxRuntime) }), schemas.PhaseFailed, schemas.CodeMaxRuntime, schemas.CodeMaxRuntime, nil},
		{"cancel never", cancel, exitOf(1, exitsOne), schemas.PhaseCancelled, schemas.CodeCancelled, schemas.CodeCancelled, nil},
		{"failed launch report", withRetry(schemas.PhaseLaunching, 1, 0, "", all...),
			report(schemas.WorkloadFailed, func(w *schemas.WorkloadObservation) { w.FailureReason = "exec format error" }), schemas.PhaseAccepted, schemas.CodeLaunchFailed, schemas.CodeLaunchFailed,
			[]string{"exec format error; retry 1 of 2"}},
		{"failed launch receipt", withRetry(schemas.PhaseLaunching, 1, 0, "", all...), receiptOf(1, schemas.CodeLaunchFailed), schemas.PhaseAccepted, schemas.CodeLaunchFailed, schemas.CodeLaunchFailed,
			[]string{"launch_workload failed: launch_failed: no such binary; retry 1 of 2"}},
		{"launch receipt not listed", withRetry(schemas.PhaseLaunching, 1, 0, "", oomOnly...), receiptOf(1, schemas.CodeLaunchFailed), schemas.PhaseFailed, schemas.CodeLaunchFailed, schemas.CodeLaunchFailed, nil},
		{"run fault never", withRetry(schemas.PhasePreparing, 1, 0, "", all...), receiptOf(1, schemas.CodeRegistryAuthFailed), schemas.PhaseFailed, schemas.CodeRegistryAuthFailed, schemas.CodeRegistryAuthFailed, nil},
		{"loss by the policy's limit", withRetry(schemas.PhaseRunning, 1, 0, "", all...), lossOf(1, "", 1), schemas.PhaseAccepted, schemas.CodeNodeLost, schemas.CodeNodeLost,
			[]string{"node n1 stopped heartbeating; retry 1 of 2"}},
		{"interruption", withRetry(schemas.PhaseRunning, 1, 0, "", all...), lossOf(1, schemas.CodeInterrupted, 3), schemas.PhaseAccepted, schemas.CodeInterrupted, schemas.CodeInterrupted, nil},
		{"loss not listed", withRetry(schemas.PhaseRunning, 1, 0, "", oomOnly...), lossOf(1, "", 3), schemas.PhaseLost, schemas.CodeNodeLost, schemas.CodeNodeLost, nil},
		{"loss spent", withRetry(schemas.PhaseRunning, 3, 0, "", all...), lossOf(3, "", 9), schemas.PhaseLost, schemas.CodeAttemptsExhausted, schemas.CodeNodeLost,
			[]string{"no retry left (3 of 3 attempts failed)"}},
		{"no policy: oom ends it", withRetry(schemas.PhaseRunning, 1, 0, ""), exitOf(1, oom), schemas.PhaseFailed, schemas.CodeOOMKilled, schemas.CodeOOMKilled, nil},
		{"no policy: launch receipt ends it", withRetry(schemas.PhaseLaunching, 1, 0, ""), receiptOf(1, ""), schemas.PhaseFailed, schemas.CodeLaunchFailed, schemas.CodeLaunchFailed, nil},
		{"no policy: interruption retried", withRetry(schemas.PhaseRunning, 1, 0, ""), lossOf(1, schemas.CodeInterrupted, 3), schemas.PhaseAccepted, schemas.CodeInterrupted, schemas.CodeInterrupted, nil},
		{"no policy: loss after a preemption", withRetry(schemas.PhaseRunning, 2, 1, ""), lossOf(2, "", 2), schemas.PhaseAccepted, schemas.CodeNodeLost, schemas.CodeNodeLost, nil},
		{"no policy: loss spent", withRetry(schemas.PhaseRunning, 2, 0, ""), lossOf(2, schemas.CodeInterrupted, 2), schemas.PhaseLost, schemas.CodeAttemptsExhausted, schemas.CodeInterrupted, nil},
	}
	for _, c := range cases {
		got, evs, err := c.in.Apply(c.r)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got.Phase != c.phase || got.Reason != string(c.reason) || got.Stopping != "" {
			t.Errorf("%s: phase %s reason %q stopping %q, want %s %q", c.name, got.Phase, got.Reason, got.Stopping, c.phase, c.reason)
		}
		if len(evs) != 1 || evs[0].Type != schemas.EventPhase || evs[0].Code != c.code || evs[0].NodeID != "n1" || evs[0].From != c.r.Phase {
			t.Errorf("%s: events %+v, want one phase event coded %q naming n1", c.name, evs, c.code)
			continue
		}
		for _, m := range c.msg {
			if !strings.Contains(evs[0].Message, m) {
				t.Errorf("%s: event message %q lacks %q", c.name, evs[0].Message, m)
			}
		}
		if got.Phase == schemas.PhaseAccepted {
			wantWait := schemas.Code("")
			if backoff(got, failures(got)) > 0 {
				wantWait = schemas.CodeRetryBackoff
			}
			if got.NodeID != "" || got.GPUs != nil || got.Queued || got.WaitCode != wantWait || got.ExitCode != nil || got.Attempt != c.r.Attempt {
				t.Errorf("%s: requeued Run %+v still holds its place, or waits %q (want %q)", c.name, got, got.WaitCode, wantWait)
			}
			if w := c.in; isExit(w) && evs[0].ExitCode == nil {
				t.Errorf("%s: the retry's event does not carry the attempt's exit", c.name)
			}
		}
		if c.r.NodeID != "n1" || len(c.r.GPUs) != 1 {
			t.Errorf("%s: Apply changed the Run it was given", c.name)
		}
	}
}

func isExit(t Transition) bool {
	r, ok := t.(Report)
	return ok && r.Workload.Phase == schemas.WorkloadExited
}

// TestRetryAt: the backoff doubles with each retry up to the cap, counts
// from when the Run went back to accepted, and applies to a failed
// attempt's retry alone.
func TestRetryAt(t *testing.T) {
	since := time.Unix(5000, 0)
	waiting := func(attempt, preempted int, reason schemas.Code, backoff string) schemas.Run {
		r := withRetry(schemas.PhaseAccepted, attempt, preempted, backoff, schemas.RetryOOM)
		r.Phase, r.NodeID, r.Reason, r.PhaseSince = schemas.PhaseAccepted, "", string(reason), since
		return r
	}
	noPolicy := waiting(1, 0, schemas.CodeNodeLost, "")
	noPolicy.Retry = nil
	for _, c := range []struct {
		name string
		r    schemas.Run
		want time.Duration // 0: zero time
	}{
		{"first retry", waiting(1, 0, schemas.CodeOOMKilled, "30s"), 30 * time.Second},
		{"second", waiting(2, 0, schemas.CodeOOMKilled, "30s"), time.Minute},
		{"third", waiting(3, 0, schemas.CodeOOMKilled, "30s"), 2 * time.Minute},
		{"preemptions skipped", waiting(3, 2, schemas.CodeOOMKilled, "30s"), 30 * time.Second},
		{"capped", waiting(3, 0, schemas.CodeOOMKilled, "40m"), schemas.MaxRetryBackoff},
		{"after a preemption", waiting(2, 1, schemas.CodePreempted, "30s"), 0},
		{"no backoff", waiting(1, 0, schemas.CodeOOMKilled, ""), 0},
		{"no policy", noPolicy, 0},
		{"never placed", waiting(0, 0, "", "30s"), 0},
		{"booked", withRetry(schemas.PhasePlaced, 2, 0, "30s", schemas.RetryOOM), 0},
	} {
		got := RetryAt(c.r)
		if (c.want == 0) != got.IsZero() || (c.want != 0 && !got.Equal(since.Add(c.want))) {
			t.Errorf("%s: RetryAt %v, want since+%v", c.name, got, c.want)
		}
	}
	// The scheduling pass leaves the Run until then.
	r := waiting(1, 0, schemas.CodeOOMKilled, "30s")
	tm := Timing{RedispatchAfter: time.Minute}
	if got := Due(r, 0, since.Add(29*time.Second), tm); got != StepNone {
		t.Errorf("in its backoff: %q, want none", got)
	}
	if got := Due(r, 0, since.Add(30*time.Second), tm); got != StepPlace {
		t.Errorf("backoff over: %q, want place", got)
	}
}

// TestRetryKeepsAttemptIdentity: a retried Run keeps its id; the next
// attempt is a new attempt id, and a late word about the failed one
// moves nothing.
func TestRetryKeepsAttemptIdentity(t *testing.T) {
	r, _, err := exitOf(1, oom).Apply(withRetry(schemas.PhaseRunning, 1, 0, "", schemas.RetryOOM))
	if err != nil || r.Phase != schemas.PhaseAccepted {
		t.Fatalf("retry: %+v %v", r, err)
	}
	if _, _, err := exitOf(1, oom).Apply(r); !errors.Is(err, ErrNoChange) {
		t.Errorf("the failed attempt's exit again: %v, want no change", err)
	}
	next, _, err := Placement{NodeID: "n2"}.Apply(r)
	if err != nil || next.ID != "r-1" || next.AttemptID != "r-1-a2" {
		t.Errorf("the retry's placement: %+v %v", next, err)
	}
}
