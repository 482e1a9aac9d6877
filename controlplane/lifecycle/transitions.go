package lifecycle

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// A Transition is one input to a Run: Apply returns the Run after it and
// the events that describe it (the caller numbers and stamps them), or an
// error matching ErrNoChange when there is nothing to write, or
// ErrIllegalTransition when the table refuses the move. Apply never changes
// the Run it is given.
type Transition interface {
	Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error)
}

// phaseEvent describes r's move from from to its current phase.
func phaseEvent(r *schemas.Run, from schemas.Phase, code schemas.Code, msg string) schemas.RunEvent {
	return schemas.RunEvent{
		Type: schemas.EventPhase, From: from, Phase: r.Phase, NodeID: r.NodeID, Attempt: r.Attempt,
		Code: code, Message: msg, ExitCode: r.ExitCode, OOMKilled: r.OOMKilled,
	}
}

// Placement books an accepted Run's next attempt on a node: at once, with
// the cards in GPUs, or in the node's queue behind its running work (only
// the image is prefetched until the Run heads the queue; its cards are
// chosen then). It opens the attempt's record (Settle stamps and prices
// it).
type Placement struct {
	NodeID       string
	FencingToken uint64
	Generation   uint64
	Queued       bool
	// AwaitsBytes: the queued attempt starts only once its node reports
	// its bytes prepared (Run.AwaitsBytes); ReadyBy when they should be
	// there (zero: nothing to fetch).
	AwaitsBytes bool
	ReadyBy     time.Time
	GPUs        []string
	Decision    schemas.BookingDecision
	// PricePerHour and GPUModel price the attempt (usage.Price).
	PricePerHour float64
	GPUModel     string
}

// Apply implements Transition.
func (p Placement) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.Phase != schemas.PhaseAccepted {
		return r, nil, ErrNoChange
	}
	if err := move(&r, schemas.PhasePlaced); err != nil {
		return r, nil, err
	}
	r.Attempt++
	r.NodeID, r.AttemptID, r.Waiting, r.Queued = p.NodeID, schemas.WorkloadID(r.ID, r.Attempt), "", p.Queued
	r.FencingToken, r.Generation = p.FencingToken, p.Generation
	r.AwaitsBytes, r.ReadyBy = p.Queued && p.AwaitsBytes, nil
	if !p.ReadyBy.IsZero() {
		by := p.ReadyBy
		r.ReadyBy = &by
	}
	r.GPUs, r.Execution = slices.Clone(p.GPUs), nil
	r.Attempts = append(keptAttempts(r.Attempts), schemas.AttemptRecord{
		Attempt: r.Attempt, NodeID: p.NodeID, GPUs: r.Request.Resources.GPUCount, GPUModel: p.GPUModel, PricePerHour: p.PricePerHour,
	})
	d := p.Decision
	msg := "booked on " + p.NodeID
	if len(r.GPUs) > 0 {
		msg += " with GPUs " + strings.Join(r.GPUs, ",")
	}
	switch {
	case p.Decision.FetchFirst && r.Queued:
		msg += "; fetching its image and artifacts there first, it takes its cards once they are there"
	case r.Queued:
		msg += ", queued behind its running work; prefetching the image"
	}
	booked := phaseEvent(&r, schemas.PhaseAccepted, "", msg)
	booked.GPUs = r.GPUs
	return r, []schemas.RunEvent{
		{Type: schemas.EventDecided, Phase: schemas.PhaseAccepted, NodeID: p.NodeID, Attempt: r.Attempt, GPUs: r.GPUs, Decision: &d},
		booked,
	}, nil
}

// keptAttempts is a copy of records with room for one more under
// schemas.MaxAttemptRecords: the oldest ended records go (their cost is in
// Run.CostUSD and WF_USAGE already); an open one is never dropped.
func keptAttempts(records []schemas.AttemptRecord) []schemas.AttemptRecord {
	drop := 0
	for len(records)-drop >= schemas.MaxAttemptRecords && drop < len(records) && records[drop].EndedAt != nil {
		drop++
	}
	return slices.Clone(records[drop:])
}

// Wait records why no node takes an accepted Run now: Summary condenses
// the answer, so the same answer is recorded once, however many passes
// reach it; Code is the Run's WaitCode.
type Wait struct {
	Decision schemas.BookingDecision
	Summary  string
	Code     schemas.Code
	Message  string
}

// Apply implements Transition.
func (w Wait) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.Phase != schemas.PhaseAccepted || (r.Waiting == w.Summary && r.WaitCode == w.Code) {
		return r, nil, ErrNoChange
	}
	r.Waiting, r.WaitCode = w.Summary, w.Code
	d := w.Decision
	return r, []schemas.RunEvent{{Type: schemas.EventDecided, Phase: r.Phase, Code: w.Code, Message: w.Message, Decision: &d}}, nil
}

// Unsatisfiable fails an accepted Run that every node refuses for a reason
// waiting will not change.
type Unsatisfiable struct {
	Decision schemas.BookingDecision
	Summary  string
}

// Apply implements Transition.
func (u Unsatisfiable) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.Phase != schemas.PhaseAccepted {
		return r, nil, ErrNoChange
	}
	r.Waiting = u.Summary
	d := u.Decision
	evs := []schemas.RunEvent{{Type: schemas.EventDecided, Phase: r.Phase, Code: schemas.CodeUnsatisfiable, Message: "no enrolled node can ever run this request", Decision: &d}}
	if err := move(&r, schemas.PhaseFailed); err != nil {
		return r, nil, err
	}
	r.Reason = string(schemas.CodeUnsatisfiable)
	evs = append(evs, phaseEvent(&r, schemas.PhaseAccepted, schemas.CodeUnsatisfiable,
		"every node rejects it for a reason waiting will not change"+firstRejection(d)+"; see `warmfleet run decision`"))
	return r, evs, nil
}

// firstRejection quotes one node's rejection of d, so the Run's end says
// what to change without a second command.
func firstRejection(d schemas.BookingDecision) string {
	if len(d.Candidates) == 0 {
		return ""
	}
	c := d.Candidates[0]
	return " (" + c.NodeID + ": " + string(c.Reason) + ": " + c.Detail + ")"
}

// QueueStart launches a queued attempt with the cards in GPUs: it heads
// its node's queue and fits beside what runs there.
type QueueStart struct {
	AttemptID string
	GPUs      []string
}

// Apply implements Transition.
func (q QueueStart) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if !r.Queued || r.AttemptID != q.AttemptID || r.Phase.Terminal() {
		return r, nil, ErrNoChange
	}
	r.Queued = false
	r.GPUs = slices.Clone(q.GPUs)
	msg := "left the queue; launching"
	if len(r.GPUs) > 0 {
		msg += " with GPUs " + strings.Join(r.GPUs, ",")
	}
	return r, []schemas.RunEvent{{Type: schemas.EventNote, Phase: r.Phase, NodeID: r.NodeID, Attempt: r.Attempt, GPUs: r.GPUs, Message: msg}}, nil
}

// Restamp records the node session an attempt's commands are sent under
// again: the node re-enrolled, or the commands went unanswered too long.
// It is written even when the session is unchanged, so the resend is on
// record.
type Restamp struct {
	AttemptID    string
	FencingToken uint64
	Generation   uint64
}

// Apply implements Transition.
func (s Restamp) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.AttemptID != s.AttemptID || r.Phase.Terminal() {
		return r, nil, ErrNoChange
	}
	r.FencingToken, r.Generation = s.FencingToken, s.Generation
	return r, nil, nil
}

// Report is what the Run's node saw of one attempt: a workload phase, an
// exit, or image transfer progress.
type Report struct {
	NodeID   string
	Workload schemas.WorkloadObservation
}

// Apply implements Transition. A report about another attempt or node
// changes nothing; when that attempt still runs it is ErrSuperseded. One
// about the current attempt from another node than it is booked on is
// ErrNotBookedHere (an attempt booked nowhere, lost and back to accepted, is
// another's as well, but a late report of its own node's is no intrusion).
// A report of a phase the Run has passed is ErrStaleReport.
func (p Report) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	w := p.Workload
	if r.AttemptID == w.AttemptID && r.NodeID != p.NodeID && r.NodeID != "" {
		return r, nil, ErrNotBookedHere
	}
	if r.AttemptID != w.AttemptID || r.NodeID != p.NodeID {
		if w.Phase == schemas.WorkloadRunning || w.Phase == schemas.WorkloadStarting {
			return r, nil, ErrSuperseded
		}
		return r, nil, ErrNoChange
	}
	if r.Phase.Terminal() {
		return r, nil, ErrNoChange
	}
	observed := w.ObservedAt
	if w.Progress != nil {
		if r.Phase != schemas.PhasePreparing || (r.Progress != nil && *r.Progress == *w.Progress) {
			return r, nil, ErrNoChange
		}
		prog := *w.Progress
		r.Progress = &prog
		return r, []schemas.RunEvent{{Type: schemas.EventProgress, Phase: r.Phase, NodeID: r.NodeID, Attempt: r.Attempt,
			Progress: &prog, ObservedAt: &observed, Message: prog.What() + " transfer " + prog.String()}}, nil
	}
	to, code, msg := reportedPhase(r, w)
	if to == "" || (!to.Terminal() && Rank(to) <= Rank(r.Phase)) {
		if len(w.GPUs) > 0 && !slices.Equal(w.GPUs, r.GPUs) {
			// The node's account of what the attempt holds wins: it is
			// what the container was given (a booking written by a
			// control plane that then lost its answer may differ).
			r.GPUs = slices.Clone(w.GPUs)
			return r, []schemas.RunEvent{{Type: schemas.EventNote, Phase: r.Phase, NodeID: r.NodeID, Attempt: r.Attempt, GPUs: r.GPUs,
				ObservedAt: &observed, Message: "node reports the attempt holds GPUs " + strings.Join(r.GPUs, ",")}}, nil
		}
		return r, nil, ErrStaleReport
	}
	from := r.Phase
	var ev schemas.RunEvent
	if to.Terminal() && to != schemas.PhaseCancelled {
		// A node's report is never a loss: no loss limit applies.
		var err error
		if ev, err = endAttempt(&r, from, ending{phase: to, code: code, msg: msg}, 0); err != nil {
			return r, nil, err
		}
	} else {
		if err := move(&r, to); err != nil {
			return r, nil, err
		}
		if to.Terminal() {
			r.Reason = string(code)
		}
		ev = phaseEvent(&r, from, code, msg)
	}
	if w.StartedAt != nil {
		r.StartedAt = w.StartedAt
	}
	if r.Phase.Terminal() {
		r.ExitCode, r.OOMKilled, r.FinishedAt = w.ExitCode, w.OOMKilled, w.FinishedAt
	}
	// A requeued attempt's exit is told by its event alone: the Run's
	// exit fields say how the Run ended.
	ev.ExitCode, ev.OOMKilled, ev.ObservedAt = w.ExitCode, w.OOMKilled, &observed
	return r, []schemas.RunEvent{ev}, nil
}

// reportedPhase maps a workload report onto the Run's lifecycle.
func reportedPhase(r schemas.Run, w schemas.WorkloadObservation) (schemas.Phase, schemas.Code, string) {
	switch w.Phase {
	case schemas.WorkloadPreparing:
		return schemas.PhasePreparing, "", "node is preparing the " + preparedFor(r)
	case schemas.WorkloadPrepared, schemas.WorkloadStarting:
		return schemas.PhaseLaunching, "", preparedFor(r) + " ready; starting the container"
	case schemas.WorkloadRunning:
		return schemas.PhaseRunning, "", "container running"
	case schemas.WorkloadExited:
		switch {
		case r.CancelRequested:
			return schemas.PhaseCancelled, schemas.CodeCancelled, "stopped on cancel"
		case w.StopReason == string(schemas.CodeMaxRuntime):
			return schemas.PhaseFailed, schemas.CodeMaxRuntime, "stopped after max_runtime_seconds"
		case w.OOMKilled:
			return schemas.PhaseFailed, schemas.CodeOOMKilled, "killed by the kernel for exceeding its memory limit"
		case w.ExitCode != nil && *w.ExitCode == 0:
			return schemas.PhaseSucceeded, "", "exited 0"
		default:
			return schemas.PhaseFailed, schemas.CodeExitNonZero, "exited non-zero"
		}
	case schemas.WorkloadFailed:
		if r.CancelRequested {
			return schemas.PhaseCancelled, schemas.CodeCancelled, "cancelled before start"
		}
		return schemas.PhaseFailed, failureCode(w.FailureCode), w.FailureReason
	}
	return "", "", ""
}

// preparedFor names what a node prepares for r: its image, and its
// artifacts when it mounts any.
func preparedFor(r schemas.Run) string {
	switch len(r.Artifacts) {
	case 0:
		return "image"
	case 1:
		return "image and artifact " + r.Artifacts[0].Name
	}
	return "image and " + strconv.Itoa(len(r.Artifacts)) + " artifacts"
}

// runFault are the codes a node reports (in a receipt or a failed
// workload's report) that say what the Run itself must change, so the Run
// fails with them rather than launch_failed: its image lacks the platform,
// the image's registry refused the pull, or an artifact's source served
// wrong bytes, refused its credential or could not be read, or its
// secrets could not be had at launch. Terminal like every launch
// failure, and not retried on another node: every node would be refused
// alike (each presents the same credential from the control plane).
var runFault = map[schemas.Code]bool{
	schemas.CodePlatformNotInImage:       true,
	schemas.CodeRegistryAuthFailed:       true,
	schemas.CodeArtifactDigestMismatch:   true,
	schemas.CodeArtifactSourceAuthFailed: true,
	schemas.CodeArtifactFetchFailed:      true,
	schemas.CodeSecretUnavailable:        true,
}

// failureCode is the reason a Run fails with when its node could not
// prepare or launch it.
func failureCode(reported schemas.Code) schemas.Code {
	if runFault[reported] {
		return reported
	}
	return schemas.CodeLaunchFailed
}

// ReceiptFailure ends an attempt whose node failed or refused one of its
// commands (for a reason a resend will not mend): failed, retried when the
// Run's retry policy lists launch_failed, requeued or failed as a stop
// under way says, or cancelled when a cancel was pending. NodeID is the
// node the receipt came from.
type ReceiptFailure struct {
	NodeID  string
	Receipt schemas.OperationReceipt
}

// Apply implements Transition. A receipt about the current attempt from
// another node than it is booked on is ErrNotBookedHere; one about an
// attempt booked nowhere (lost, back to accepted) changes nothing.
func (f ReceiptFailure) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	rc := f.Receipt
	if r.AttemptID == rc.AttemptID && r.NodeID != f.NodeID && r.NodeID != "" && !r.Phase.Terminal() {
		return r, nil, ErrNotBookedHere
	}
	if r.AttemptID != rc.AttemptID || r.NodeID != f.NodeID || r.Phase.Terminal() {
		return r, nil, ErrNoChange
	}
	from, msg := r.Phase, string(rc.Kind)+" "+rc.Outcome+": "+string(rc.Code)+": "+schemas.TruncateText(rc.Message, schemas.MaxReceiptMessageBytes)
	if r.CancelRequested {
		if err := move(&r, schemas.PhaseCancelled); err != nil {
			return r, nil, err
		}
		r.Reason = string(schemas.CodeCancelled)
		return r, []schemas.RunEvent{phaseEvent(&r, from, schemas.CodeCancelled, msg)}, nil
	}
	ev, err := endAttempt(&r, from, ending{phase: schemas.PhaseFailed, code: failureCode(rc.Code), msg: msg}, 0)
	if err != nil {
		return r, nil, err
	}
	return r, []schemas.RunEvent{ev}, nil
}

// Loss ends an attempt whose node is gone or no longer holds it. The Run
// retries (back to accepted, for another node) while its retry policy
// allows (without one: node loss and interruption, up to MaxAttempts
// failed attempts); it ends lost when they are spent or the policy does
// not list the cause, cancelled when a cancel was pending, and as a stop
// under way says.
type Loss struct {
	AttemptID   string
	Why         string
	MaxAttempts int
	// Cause is node_lost (the default) or interrupted (the machine was
	// taken away: a rental interrupted by its provider).
	Cause schemas.Code
}

// Apply implements Transition.
func (l Loss) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.AttemptID != l.AttemptID || r.Phase.Terminal() || r.Phase == schemas.PhaseAccepted {
		return r, nil, ErrNoChange
	}
	from, cause := r.Phase, l.Cause
	if cause == "" {
		cause = schemas.CodeNodeLost
	}
	if r.CancelRequested {
		if err := move(&r, schemas.PhaseCancelled); err != nil {
			return r, nil, err
		}
		r.Reason = string(cause)
		return r, []schemas.RunEvent{phaseEvent(&r, from, cause, l.Why)}, nil
	}
	ev, err := endAttempt(&r, from, ending{phase: schemas.PhaseLost, code: cause, msg: l.Why, exhausted: schemas.CodeAttemptsExhausted}, l.MaxAttempts)
	if err != nil {
		return r, nil, err
	}
	return r, []schemas.RunEvent{ev}, nil
}

// Cancellation asks for a Run to stop. An accepted Run is cancelled at
// once; a booked one is marked, and ends when its node reports the stop.
type Cancellation struct {
	Reason       string
	GraceSeconds int64 // 0: schemas.DefaultGraceSeconds
}

// Apply implements Transition.
func (c Cancellation) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.Phase.Terminal() || r.CancelRequested {
		return r, nil, ErrNoChange
	}
	grace := c.GraceSeconds
	if grace == 0 {
		grace = schemas.DefaultGraceSeconds
	}
	r.CancelRequested, r.CancelReason, r.GraceSeconds = true, c.Reason, grace
	evs := []schemas.RunEvent{{Type: schemas.EventCancel, Phase: r.Phase, Message: c.Reason}}
	if r.Phase == schemas.PhaseAccepted {
		if err := move(&r, schemas.PhaseCancelled); err != nil {
			return r, nil, err
		}
		r.Reason = "cancelled before placement"
		evs = append(evs, phaseEvent(&r, schemas.PhaseAccepted, schemas.CodeCancelled, r.Reason))
	}
	return r, evs, nil
}
