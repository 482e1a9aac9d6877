package controlplane

import (
	"context"
	"errors"
	"reflect"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// intakeJob is one WF_RUNS message, decoded once by the consumer's callback
// so that it can be routed by Run id: a Run's submit and cancel go to the
// same intake worker and keep their stream order.
type intakeJob struct {
	m jetstream.Msg
	// key routes the job: the Run id, or refusedKey for refused input.
	key string
	// redelivered: an earlier delivery may have stopped half way.
	redelivered bool
	submit      *schemas.RunRequest
	cancel      *schemas.CancelRun
	// refusal is set when the message is refused as it stands; requestID
	// is then whatever request id it carried, for the rejected event.
	refusal   *schemas.Refusal
	requestID string
}

// refusedKey routes every refused intake message to the same worker.
const refusedKey = "\x00refused"

// parseIntake decodes and validates one intake message.
func (cp *ControlPlane) parseIntake(ctx context.Context, m jetstream.Msg) intakeJob {
	job := intakeJob{m: m, redelivered: repairing(ctx)}
	switch m.Subject() {
	case bus.SubjectSubmit:
		req, _, err := schemas.DecodeRunRequest(m.Headers(), m.Data())
		job.requestID = req.RequestID
		if err != nil {
			job.refusal = schemas.AsRefusal(err)
		} else {
			job.submit = &req
		}
		if job.requestID != "" {
			job.key = schemas.RunIDFor(job.requestID)
		}
	case bus.SubjectCancel:
		var c schemas.CancelRun
		enc := codec.Detect(m.Headers(), m.Data())
		if err := codec.Decode(enc, m.Data(), &c); err != nil {
			code := schemas.CodeMalformed
			if errors.Is(err, codec.ErrUnknownField) {
				code = schemas.CodeUnknownField
			}
			job.refusal = &schemas.Refusal{Code: code, Reason: "cancel body is not a CancelRun object"}
			break
		}
		job.key = c.RunID
		if err := c.Validate(); err != nil {
			job.refusal, job.requestID = schemas.AsRefusal(err), c.RequestID
			break
		}
		job.cancel = &c
	default:
		job.refusal = &schemas.Refusal{Code: schemas.CodeMalformed, Reason: "unknown intake subject " + m.Subject()}
	}
	if job.refusal != nil {
		// Refusals go through one worker, so they are answered in stream
		// order (a producer reading its rejections sees them in the order
		// it sent), and a flood of bad input holds up one worker, not all.
		job.key = refusedKey
	}
	return job
}

// handleIntake handles one WF_RUNS message on an intake worker. Refused
// input is answered with a rejected event and terminated; a transient
// failure is left unacked so JetStream redelivers it under the consumer's
// BackOff.
func (cp *ControlPlane) handleIntake(ctx context.Context, job intakeJob) {
	if job.redelivered {
		ctx = markRepair(ctx)
	}
	m := job.m
	var err error
	switch {
	case job.refusal != nil:
		err = cp.reject(ctx, m, job.requestID, job.refusal)
	case job.submit != nil:
		err = cp.submit(ctx, m, *job.submit)
	case job.cancel != nil:
		err = cp.cancel(ctx, m, *job.cancel)
	}
	if err != nil {
		cp.log.Warn("intake will retry", zap.String("subject", m.Subject()), zap.Error(err))
		_ = m.Nak() // redelivered after the consumer's BackOff
		return
	}
	_ = m.Ack()
}

// submit turns one valid RunRequest into a stored Run, or a rejection.
func (cp *ControlPlane) submit(ctx context.Context, m jetstream.Msg, req schemas.RunRequest) error {
	run, dup, err := cp.createRun(ctx, req)
	if err != nil {
		return err
	}
	if dup {
		if !reflect.DeepEqual(normalise(run.Request), normalise(req)) {
			return cp.reject(ctx, m, req.RequestID, &schemas.Refusal{Code: schemas.CodeRequestIDConflict, Field: "request_id",
				Reason: "this request id already names a different Run (" + run.ID + "); use a new request id for a new Run"})
		}
		// The same request again: one Run. Republish its latest events in
		// case the first delivery died between the KV write and the publish.
		cp.log.Debug("duplicate submit", zap.String("run_id", run.ID))
		return cp.publishEvents(ctx, run.Outbox)
	}
	cp.log.Debug("run accepted", zap.String("run_id", run.ID), zap.String("request_id", req.RequestID))
	if run.Waiting == "" {
		cp.poke() // not decided at intake: the scheduler's turn
	}
	return nil
}

// normalise makes empty and nil collections compare equal across encodings.
func normalise(r schemas.RunRequest) schemas.RunRequest {
	if len(r.Command) == 0 {
		r.Command = nil
	}
	if len(r.Args) == 0 {
		r.Args = nil
	}
	if len(r.Env) == 0 {
		r.Env = nil
	}
	if len(r.Labels) == 0 {
		r.Labels = nil
	}
	r.Version = 0
	return r
}

// reject publishes a coded rejected event. It goes on the subject of the Run
// the request id would have named, so a producer watching its own Run sees
// why; input without a usable request id goes under "rejected".
func (cp *ControlPlane) reject(ctx context.Context, m jetstream.Msg, requestID string, ref *schemas.Refusal) error {
	cp.metrics.rejected.Add(1)
	runID := "rejected"
	if requestID != "" && schemas.ValidateID("request_id", requestID, schemas.CodeInvalidRequestID) == nil {
		runID = schemas.RunIDFor(requestID)
	} else {
		requestID = ""
	}
	meta, err := m.Metadata()
	if err != nil {
		return err
	}
	ev := schemas.RunEvent{
		RunID: runID, Type: schemas.EventRejected, RequestID: requestID,
		Code: ref.Code, Field: ref.Field, Message: ref.Reason, At: cp.now(),
	}
	cp.log.Info("request refused", zap.String("subject", m.Subject()), zap.String("code", string(ref.Code)), zap.String("field", ref.Field))
	return cp.publishEvent(ctx, ev, "rejected:"+strconv.FormatUint(meta.Sequence.Stream, 10))
}

// cancel marks a Run for cancellation and stops it where it runs.
func (cp *ControlPlane) cancel(ctx context.Context, m jetstream.Msg, c schemas.CancelRun) error {
	grace := c.GraceSeconds
	if grace == 0 {
		grace = schemas.DefaultGraceSeconds
	}
	run, err := cp.advance(ctx, c.RunID, func(r *schemas.Run, emit func(schemas.RunEvent)) error {
		if r.Phase.Terminal() || r.CancelRequested {
			return bus.ErrNoChange
		}
		r.CancelRequested, r.CancelReason, r.GraceSeconds = true, c.Reason, grace
		emit(schemas.RunEvent{Type: schemas.EventCancel, Phase: r.Phase, Message: c.Reason})
		if r.Phase == schemas.PhaseAccepted {
			from := r.Phase
			r.Phase, r.Reason = schemas.PhaseCancelled, "cancelled before placement"
			emit(phaseEvent(r, from, schemas.CodeCancelled, r.Reason))
		}
		return nil
	})
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return cp.reject(ctx, m, "", &schemas.Refusal{Code: schemas.CodeRunNotFound, Field: "run_id", Reason: "no Run " + c.RunID + "; check the id with `warmfleet run list`"})
	case errors.Is(err, bus.ErrNoChange):
		return nil
	case err != nil:
		return err
	}
	if !run.Phase.Terminal() {
		return cp.sendStop(ctx, run, "cancelled")
	}
	return nil
}
