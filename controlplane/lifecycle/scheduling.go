package lifecycle

import (
	"fmt"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// The control plane's own stops of an attempt (preemption, a start
// deadline, a budget) mark the Run Stopping: the scheduler sends the stop
// (StopReason, the Run's GraceSeconds) and sends it again while the node
// has not answered (StepStop); the attempt's reported end, however it
// ended, then moves the Run as the stop's code says (endAttempt). A
// cancel requested meanwhile wins.

// ErrNotPreemptible: a Preemption names a Run that did not declare
// itself preemptible; nothing is written. It matches ErrNoChange.
var ErrNotPreemptible = fmt.Errorf("%w: run is not preemptible", ErrNoChange)

// Preemption stops a booked attempt that holds its place, to make room for
// Run By (Why: "priority" or "reclaim"): the node stops it with its grace
// period, and its end requeues the Run with reason preempted. A queued
// attempt holds no place, so there is nothing to preempt; a Run that did
// not declare itself preemptible is never preempted (ErrNotPreemptible).
type Preemption struct {
	AttemptID    string
	By           string
	Why          string
	GraceSeconds int64 // 0: the Run's own (Request.GraceSeconds), else schemas.DefaultGraceSeconds
}

// Apply implements Transition.
func (p Preemption) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.AttemptID != p.AttemptID || !stoppable(r) || r.Queued {
		return r, nil, ErrNoChange
	}
	if !r.Request.Preemptible {
		return r, nil, ErrNotPreemptible
	}
	r.Stopping, r.GraceSeconds = schemas.CodePreempted, graceOf(r, p.GraceSeconds)
	msg := fmt.Sprintf("preempted by run %s (%s): stopping attempt %d with %ds grace; it is then placed again", p.By, p.Why, r.Attempt, r.GraceSeconds)
	return r, []schemas.RunEvent{stopEvent(&r, msg)}, nil
}

// DeadlineExceeded ends a Run that has not started by its start deadline:
// an unbooked or queued one fails at once; one dispatched to its node is
// stopped, and fails deadline_exceeded when the stop is reported. A Run
// that has started once (running, or requeued after it ran) is past the
// deadline's reach.
type DeadlineExceeded struct{}

// Apply implements Transition.
func (DeadlineExceeded) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.Phase.Terminal() || r.Phase == schemas.PhaseRunning || r.StartedAt != nil || r.CancelRequested || r.Stopping != "" {
		return r, nil, ErrNoChange
	}
	msg := fmt.Sprintf("not started within its start deadline of %ds", r.Request.StartDeadlineSeconds)
	if r.Phase == schemas.PhaseAccepted || r.Queued {
		return failNow(r, schemas.CodeDeadlineExceeded, msg)
	}
	r.Stopping, r.GraceSeconds = schemas.CodeDeadlineExceeded, graceOf(r, 0)
	return r, []schemas.RunEvent{stopEvent(&r, msg+fmt.Sprintf("; stopping attempt %d with %ds grace", r.Attempt, r.GraceSeconds))}, nil
}

// BudgetStop stops a running attempt whose tenant passed a budget that
// stops running Runs; its end fails the Run budget_exceeded. A queued
// attempt holds nothing yet and fails at once.
type BudgetStop struct {
	AttemptID string
	Why       string
}

// Apply implements Transition.
func (b BudgetStop) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.AttemptID != b.AttemptID || !stoppable(r) {
		return r, nil, ErrNoChange
	}
	msg := "its tenant is past a budget that stops running Runs: " + b.Why
	if r.Queued {
		return failNow(r, schemas.CodeBudgetExceeded, msg)
	}
	r.Stopping, r.GraceSeconds = schemas.CodeBudgetExceeded, graceOf(r, 0)
	return r, []schemas.RunEvent{stopEvent(&r, msg+fmt.Sprintf("; stopping attempt %d with %ds grace", r.Attempt, r.GraceSeconds))}, nil
}

// StopReason is the reason to send a stop of r's current attempt with:
// "cancelled" while a cancel is pending, else the code the control plane
// stops it for; "" when no stop is under way. Send it with r.GraceSeconds.
func StopReason(r schemas.Run) string {
	switch {
	case r.Phase.Terminal() || r.Phase == schemas.PhaseAccepted:
		return ""
	case r.CancelRequested:
		return string(schemas.CodeCancelled)
	}
	return string(r.Stopping)
}

// stoppable: r's current attempt is booked and no stop is under way.
func stoppable(r schemas.Run) bool {
	return !r.Phase.Terminal() && r.Phase != schemas.PhaseAccepted && !r.CancelRequested && r.Stopping == ""
}

// graceOf is the grace a stop of r is sent with: given, else the Run's
// own, else the default.
func graceOf(r schemas.Run, given int64) int64 {
	switch {
	case given > 0:
		return given
	case r.Request.GraceSeconds > 0:
		return r.Request.GraceSeconds
	}
	return schemas.DefaultGraceSeconds
}

// stopEvent records a stop the control plane starts; the phase moves when
// the node reports the attempt's end.
func stopEvent(r *schemas.Run, msg string) schemas.RunEvent {
	return schemas.RunEvent{Type: schemas.EventNote, Phase: r.Phase, NodeID: r.NodeID, Attempt: r.Attempt, Code: r.Stopping, Message: msg}
}

// failNow fails r with code before its attempt (if any) holds anything:
// a terminal Run is booked nowhere, so a queued one leaves its node's
// queue.
func failNow(r schemas.Run, code schemas.Code, msg string) (schemas.Run, []schemas.RunEvent, error) {
	from := r.Phase
	if err := move(&r, schemas.PhaseFailed); err != nil {
		return r, nil, err
	}
	r.Reason, r.Queued = string(code), false
	return r, []schemas.RunEvent{phaseEvent(&r, from, code, msg)}, nil
}

// Settle stamps r's attempt records at now, after a transition: when the
// current attempt began to hold its place, and the end and cost of one
// that ended. It returns the attempt_ended event of each attempt it ends.
func Settle(r *schemas.Run, now time.Time) []schemas.RunEvent {
	var evs []schemas.RunEvent
	cloned := false
	for i := range r.Attempts {
		a := r.Attempts[i]
		if a.EndedAt != nil {
			continue
		}
		current := a.Attempt == r.Attempt && !r.Phase.Terminal() && r.Phase != schemas.PhaseAccepted
		if current && (a.HeldFrom != nil || r.Queued) {
			continue
		}
		if !cloned {
			// The records may share their array with the Run a
			// transition was given; that Run is not changed.
			r.Attempts, cloned = append([]schemas.AttemptRecord(nil), r.Attempts...), true
		}
		if current {
			held := now
			r.Attempts[i].HeldFrom = &held
			continue
		}
		evs = append(evs, endRecord(r, &r.Attempts[i], now))
	}
	return evs
}

// endRecord closes attempt record a of r at now and prices it.
func endRecord(r *schemas.Run, a *schemas.AttemptRecord, now time.Time) schemas.RunEvent {
	ended := now
	a.EndedAt = &ended
	switch r.Phase {
	case schemas.PhaseSucceeded:
		a.Outcome = schemas.Code(schemas.PhaseSucceeded)
	case schemas.PhaseCancelled:
		a.Outcome = schemas.CodeCancelled
	default:
		a.Outcome = schemas.Code(r.Reason)
	}
	var held time.Duration
	if a.HeldFrom != nil {
		held = max(0, now.Sub(*a.HeldFrom))
	}
	a.CostUSD = a.PricePerHour * held.Hours()
	r.CostUSD += a.CostUSD
	usage := *a
	return schemas.RunEvent{
		Type: schemas.EventAttemptEnded, Phase: r.Phase, NodeID: a.NodeID, Attempt: a.Attempt, Code: a.Outcome, Usage: &usage,
		Message: fmt.Sprintf("attempt %d on %s ended %s after holding its place %s: %.4f USD", a.Attempt, a.NodeID, a.Outcome, held.Round(time.Second), a.CostUSD),
	}
}

// Deadline is when r must have started running by; zero without one.
func Deadline(r schemas.Run) time.Time {
	if r.Request.StartDeadlineSeconds <= 0 {
		return time.Time{}
	}
	return r.CreatedAt.Add(time.Duration(r.Request.StartDeadlineSeconds) * time.Second)
}
