package lifecycle

import (
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// Stage refines a Run's phase by what the control plane owes it: a placed
// Run may be queued on its node or dispatched to it, and any booked Run
// may be waiting for a requested cancel, or a stop of the control plane's
// own, to take effect.
type Stage string

const (
	StageWaiting    Stage = "waiting"    // accepted: no node yet
	StageQueued     Stage = "queued"     // booked in a node's queue, for room or its bytes; only its image and artifacts are prepared
	StageDispatched Stage = "dispatched" // placed, preparing or launching on its node
	StageRunning    Stage = "running"
	StageCancelling Stage = "cancelling" // booked, with a cancel requested
	StageStopping   Stage = "stopping"   // booked, stopped by the control plane (Run.Stopping)
	StageEnded      Stage = "ended"
)

// StageOf classifies r.
func StageOf(r schemas.Run) Stage {
	switch {
	case r.Phase.Terminal():
		return StageEnded
	case r.Phase == schemas.PhaseAccepted:
		return StageWaiting
	case r.CancelRequested:
		return StageCancelling
	case r.Stopping != "":
		return StageStopping
	case r.Queued:
		return StageQueued
	case r.Phase == schemas.PhaseRunning:
		return StageRunning
	}
	return StageDispatched
}

// Step is what a scheduling pass owes a Run.
type Step string

const (
	StepNone Step = ""
	// StepPlace: decide the Run's next attempt, and book, rent or wait.
	StepPlace Step = "place"
	// StepStartQueued: launch the queued attempt if its bytes are there,
	// it heads its node's queue and it fits now.
	StepStartQueued Step = "start-queued"
	// StepStop: the cancel, or the control plane's stop, has not taken
	// effect in time; ask the node again (StopReason, Run.GraceSeconds).
	StepStop Step = "stop"
	// StepResend: send the attempt's commands again under the node's
	// current session (same operation ids, so the node applies each once):
	// a queued attempt's preparation, any other's launch.
	StepResend Step = "resend"
	// StepStopOverdue: the Run runs past its max runtime and the node has
	// not stopped it.
	StepStopOverdue Step = "stop-overdue"
	// StepDeadline: the Run has not started by its start deadline.
	StepDeadline Step = "deadline"
)

// Fetching reports whether r's bytes are still on their way to its node:
// its attempt is booked there and not yet prepared, and it is either
// dispatched (its launch fetches them) or queued to claim its cards once
// they are there (AwaitsBytes). A queued Run on a node that does not
// prepare ahead fetches nothing until it starts.
func Fetching(r schemas.Run) bool {
	booked := r.Phase == schemas.PhasePlaced || r.Phase == schemas.PhasePreparing
	return booked && (!r.Queued || r.AwaitsBytes)
}

// Timing is how long a pass lets a Run go without progress.
type Timing struct {
	// RedispatchAfter: a booked Run with no progress this long has its
	// commands (or its stop) sent again.
	RedispatchAfter time.Duration
	// MaxRuntimeSlack: how long past its max runtime a Run may run before
	// the control plane stops it itself.
	MaxRuntimeSlack time.Duration
}

// Due is the step a pass owes r at now. nodeToken is the fencing token the
// Run's node holds now (0 when unknown): a higher one than the attempt's
// means the node re-enrolled since its commands went out. A Run that has
// not started by its start deadline is owed StepDeadline first; one
// waiting out a retry's backoff is owed nothing until RetryAt.
func Due(r schemas.Run, nodeToken uint64, now time.Time, t Timing) Step {
	stale := now.Sub(r.PhaseSince) > t.RedispatchAfter
	stage := StageOf(r)
	if pastDeadline(r, stage, now) {
		return StepDeadline
	}
	switch stage {
	case StageWaiting:
		if now.Before(RetryAt(r)) {
			return StepNone
		}
		return StepPlace
	case StageQueued:
		if Fetching(r) && (nodeToken > r.FencingToken || stale) {
			return StepResend // its preparation, under the node's current session
		}
		return StepStartQueued
	case StageCancelling, StageStopping:
		if stale {
			return StepStop
		}
	case StageDispatched:
		if nodeToken > r.FencingToken || stale {
			return StepResend
		}
	case StageRunning:
		if nodeToken > r.FencingToken {
			return StepResend
		}
		if max := r.Request.MaxRuntimeSeconds; max > 0 && now.Sub(r.PhaseSince) > time.Duration(max)*time.Second+t.MaxRuntimeSlack {
			return StepStopOverdue
		}
	}
	return StepNone
}

// pastDeadline reports whether r, in stage, has not started by its start
// deadline at now and nothing stops it yet.
func pastDeadline(r schemas.Run, stage Stage, now time.Time) bool {
	switch stage {
	case StageWaiting, StageQueued, StageDispatched:
		d := Deadline(r)
		return !d.IsZero() && r.StartedAt == nil && !now.Before(d)
	}
	return false
}
