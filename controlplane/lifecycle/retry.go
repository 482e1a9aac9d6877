package lifecycle

import (
	"fmt"
	"slices"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// retryEvents names, in the retry policy's words, the attempt endings a
// policy may retry; an ending not here (a run fault, a cancel,
// max_runtime, a deadline or budget stop) is never retried.
var retryEvents = map[schemas.Code]schemas.RetryEvent{
	schemas.CodeExitNonZero:  schemas.RetryExitNonZero,
	schemas.CodeOOMKilled:    schemas.RetryOOM,
	schemas.CodeLaunchFailed: schemas.RetryLaunchFailed,
	schemas.CodeNodeLost:     schemas.RetryNodeLost,
	schemas.CodeInterrupted:  schemas.RetryInterrupted,
}

// failures counts r's attempts that failed, the current one included:
// preempted attempts do not count against a retry policy.
func failures(r schemas.Run) int { return r.Attempt - r.Preemptions }

// retryLimit is how many failed attempts r may have when its attempt
// ends with code, and whether that ending is retried at all. Without a
// policy only the loss of the attempt's machine is, up to lossMax (the
// control plane's MaxAttempts).
func retryLimit(r schemas.Run, code schemas.Code, lossMax int) (int, bool) {
	ev, ok := retryEvents[code]
	if !ok {
		return 0, false
	}
	if r.Retry == nil {
		return lossMax, ev == schemas.RetryNodeLost || ev == schemas.RetryInterrupted
	}
	return r.Retry.MaxAttempts, slices.Contains(r.Retry.On, ev)
}

// backoff is the wait before r's retry-th retry: the policy's backoff,
// doubled for each retry after the first, at most schemas.MaxRetryBackoff.
func backoff(r schemas.Run, retry int) time.Duration {
	if r.Retry == nil {
		return 0
	}
	d, err := r.Retry.BackoffDuration()
	if err != nil || d <= 0 {
		return 0 // intake refuses a bad one; a stored Run is never refused
	}
	for i := 1; i < retry && d < schemas.MaxRetryBackoff; i++ {
		d *= 2
	}
	return min(d, schemas.MaxRetryBackoff)
}

// RetryAt is when a Run waiting to retry may be placed again (its backoff
// after the attempt that failed); zero when it need not wait.
func RetryAt(r schemas.Run) time.Time {
	if r.Phase != schemas.PhaseAccepted || r.Attempt == 0 {
		return time.Time{}
	}
	if _, retried := retryEvents[schemas.Code(r.Reason)]; !retried {
		return time.Time{} // never placed, or requeued by a preemption
	}
	d := backoff(r, failures(r))
	if d == 0 {
		return time.Time{}
	}
	return r.PhaseSince.Add(d)
}

// ending is how an attempt ended as its node (or the loss of it) told,
// before the Run's stop and retry policy have their say.
type ending struct {
	phase schemas.Phase // terminal
	code  schemas.Code
	msg   string
	// exhausted is the Run's reason when the ending is retried but no
	// retry is left; empty: code.
	exhausted schemas.Code
}

// endAttempt moves r at the end of its current attempt (a pending cancel
// is the caller's to honour first): as its stop says when the control
// plane was stopping it, back to accepted when its retry policy retries
// the ending, else to e's phase. It returns the phase event.
func endAttempt(r *schemas.Run, from schemas.Phase, e ending, lossMax int) (schemas.RunEvent, error) {
	reason := e.code
	stop := r.Stopping
	if e.phase == schemas.PhaseSucceeded {
		stop = "" // it finished its work before the stop took effect: never run again, never failed late
	}
	switch stop {
	case schemas.CodePreempted:
		return requeue(r, from, schemas.CodePreempted, "stopped for preemption ("+e.msg+")", 0)
	case schemas.CodeDeadlineExceeded, schemas.CodeBudgetExceeded:
		e = ending{phase: schemas.PhaseFailed, code: r.Stopping, msg: stoppedFor(r.Stopping) + " (" + e.msg + ")"}
		reason = e.code
	default:
		if max, ok := retryLimit(*r, e.code, lossMax); ok {
			if failures(*r) < max {
				return requeue(r, from, e.code, e.msg, max)
			}
			e.msg += fmt.Sprintf("; no retry left (%d of %d attempts failed)", failures(*r), max)
			if e.exhausted != "" {
				reason = e.exhausted
			}
		}
	}
	if err := move(r, e.phase); err != nil {
		return schemas.RunEvent{}, err
	}
	r.Reason = string(reason)
	return phaseEvent(r, from, e.code, e.msg), nil
}

// requeue sends r back to accepted after its attempt ended with code: a
// retry (max failed attempts allowed) or a preempted attempt placed again.
// what says how the attempt ended; the event adds where, and what next.
func requeue(r *schemas.Run, from schemas.Phase, code schemas.Code, what string, max int) (schemas.RunEvent, error) {
	node := r.NodeID
	if err := move(r, schemas.PhaseAccepted); err != nil {
		return schemas.RunEvent{}, err
	}
	r.Reason = string(code)
	msg := fmt.Sprintf("attempt %d on %s: %s; ", r.Attempt, node, what)
	if code == schemas.CodePreempted {
		r.Preemptions++
		msg += "requeued; a preempted attempt does not count against its retries"
	} else {
		n := failures(*r)
		msg += fmt.Sprintf("retry %d of %d", n, max-1)
		if wait := backoff(*r, n); wait > 0 {
			r.WaitCode = schemas.CodeRetryBackoff
			msg += " after a backoff of " + wait.String()
		} else {
			msg += ", placed again at once"
		}
		msg += "; its placement penalises node " + node
	}
	ev := phaseEvent(r, from, code, msg)
	r.NodeID, r.GPUs, r.Queued, r.AwaitsBytes, r.ReadyBy = "", nil, false, false, nil
	return ev, nil
}

// stoppedFor says why the control plane stopped an attempt.
func stoppedFor(c schemas.Code) string {
	switch c {
	case schemas.CodeDeadlineExceeded:
		return "stopped: not started by its start deadline"
	case schemas.CodeBudgetExceeded:
		return "stopped: its tenant is past its budget"
	}
	return "stopped: " + string(c)
}
