package lifecycle

import (
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// SKELETON (issue 34): the lifecycle helper replaces these bodies.

// Preemption stops a booked attempt that holds its place, to make room for
// Run By (Why: "priority" or "reclaim"): the node stops it with its grace
// period, and its end requeues the Run with reason preempted.
type Preemption struct {
	AttemptID    string
	By           string
	Why          string
	GraceSeconds int64
}

// Apply implements Transition.
func (p Preemption) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	panic("i34 skeleton: lifecycle.Preemption")
}

// DeadlineExceeded ends a Run that has not started by its start deadline:
// an unbooked or queued one fails at once; one dispatched to its node is
// stopped, and fails deadline_exceeded when the stop is reported.
type DeadlineExceeded struct{}

// Apply implements Transition.
func (DeadlineExceeded) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	panic("i34 skeleton: lifecycle.DeadlineExceeded")
}

// BudgetStop stops a running attempt whose tenant passed a budget that
// stops running Runs; its end fails the Run budget_exceeded.
type BudgetStop struct {
	AttemptID string
	Why       string
}

// Apply implements Transition.
func (BudgetStop) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	panic("i34 skeleton: lifecycle.BudgetStop")
}

// Settle stamps r's attempt records at now, after a transition: when the
// current attempt began to hold its place, and the end and cost of one
// that ended. It returns the attempt_ended event of each attempt it ends.
func Settle(r *schemas.Run, now time.Time) []schemas.RunEvent {
	return nil
}

// RetryAt is when a Run waiting to retry may be placed again (its backoff
// after the attempt that failed); zero when it need not wait.
func RetryAt(r schemas.Run) time.Time {
	return time.Time{}
}

// Deadline is when r must have started running by; zero without one.
func Deadline(r schemas.Run) time.Time {
	if r.Request.StartDeadlineSeconds <= 0 {
		return time.Time{}
	}
	return r.CreatedAt.Add(time.Duration(r.Request.StartDeadlineSeconds) * time.Second)
}
