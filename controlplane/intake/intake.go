// Package intake takes producers' requests off WF_RUNS: a valid submit
// becomes a stored Run (once per request id), a cancel marks its Run and
// stops it where it runs, and anything else is answered with a coded
// rejected event.
package intake

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/schemas"
)

// Scheduler is what intake asks of the scheduler.
type Scheduler interface {
	// AtIntake is the decision a new Run can be stored with, or nil.
	AtIntake(r schemas.Run) lifecycle.Transition
	// Poke asks for a scheduling pass now.
	Poke()
}

// ArtifactResolver is what intake asks of the artifact catalog.
type ArtifactResolver interface {
	// Resolve answers a Run's artifact uses in order. A use the catalog
	// cannot answer is a *schemas.Refusal; any other error is transient.
	Resolve(ctx context.Context, uses []schemas.ArtifactUse) ([]schemas.ArtifactMount, error)
}

// Intake handles WF_RUNS messages.
type Intake struct {
	runs      *runs.Store
	sched     Scheduler
	dispatch  *dispatch.Dispatcher
	artifacts ArtifactResolver
	secrets   SecretChecker
	now       func() time.Time
	log       *zap.Logger
	rejected  atomic.Int64
}

// New returns an intake writing Runs to store, resolving their artifacts
// through artifacts and checking the secrets they reference in secrets
// (nil: none held, and a Run referencing one is refused).
func New(store *runs.Store, sched Scheduler, d *dispatch.Dispatcher, artifacts ArtifactResolver, secrets SecretChecker, now func() time.Time, log *zap.Logger) *Intake {
	return &Intake{runs: store, sched: sched, dispatch: d, artifacts: artifacts, secrets: secrets, now: now, log: log}
}

// Rejected counts refused intake messages.
func (in *Intake) Rejected() int64 { return in.rejected.Load() }

// Job is one WF_RUNS message, decoded once by the consumer's callback
// so that it can be routed by Run id: a Run's submit and cancel go to the
// same intake worker and keep their stream order.
type Job struct {
	m jetstream.Msg
	// Key routes the job: the Run id, or refusedKey for refused input.
	Key string
	// redelivered: an earlier delivery may have stopped half way.
	redelivered bool
	submit      *schemas.RunRequest
	cancel      *schemas.CancelRun
	// refusal is set when the message is refused as it stands; requestID
	// is then whatever request id it carried, for the rejected event.
	refusal   *schemas.Refusal
	requestID string
	// tenant owns the submitted Run: whose secrets it may reference.
	tenant string
}

// refusedKey routes every refused intake message to the same worker.
const refusedKey = "\x00refused"

// Parse decodes and validates one intake message; redelivered says the
// message was delivered before.
func Parse(m jetstream.Msg, redelivered bool) Job {
	job := Job{m: m, redelivered: redelivered, tenant: schemas.DefaultTenant}
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
			job.Key = schemas.RunIDFor(job.requestID)
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
		job.Key = c.RunID
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
		job.Key = refusedKey
	}
	return job
}

// Handle handles one WF_RUNS message on an intake worker. Refused
// input is answered with a rejected event and terminated; a transient
// failure is left unacked so JetStream redelivers it under the consumer's
// BackOff.
func (in *Intake) Handle(ctx context.Context, job Job) {
	m := job.m
	var err error
	switch {
	case job.refusal != nil:
		err = in.reject(ctx, m, job.requestID, job.refusal)
	case job.submit != nil:
		err = in.submit(ctx, m, job.tenant, *job.submit)
	case job.cancel != nil:
		err = in.cancel(ctx, m, *job.cancel, job.redelivered)
	}
	if err != nil {
		in.log.Warn("intake will retry", zap.String("subject", m.Subject()), zap.Error(err))
		_ = m.Nak() // redelivered after the consumer's BackOff
		return
	}
	_ = m.Ack()
}

// submit turns one valid RunRequest into a stored Run, or a rejection.
func (in *Intake) submit(ctx context.Context, m jetstream.Msg, tenant string, req schemas.RunRequest) error {
	err := in.checkSecrets(ctx, tenant, req)
	var mounts []schemas.ArtifactMount
	if err == nil {
		mounts, err = in.resolve(ctx, req)
	}
	var ref *schemas.Refusal
	if errors.As(err, &ref) {
		// A submit delivered again may name an artifact or a secret
		// removed since its Run was accepted: the Run stands, and is
		// handled as a duplicate below.
		stored, found, gerr := in.runs.Stored(ctx, schemas.RunIDFor(req.RequestID))
		if gerr != nil {
			return gerr
		}
		if !found {
			return in.reject(ctx, m, req.RequestID, ref)
		}
		mounts = stored.Artifacts
	} else if err != nil {
		return err // the catalog is unavailable: redelivered
	}
	run, dup, err := in.runs.Create(ctx, req, mounts, in.sched.AtIntake)
	if err != nil {
		return err
	}
	if dup {
		if !reflect.DeepEqual(normalise(run.Request), normalise(req)) {
			return in.reject(ctx, m, req.RequestID, &schemas.Refusal{Code: schemas.CodeRequestIDConflict, Field: "request_id",
				Reason: "this request id already names a different Run (" + run.ID + "); use a new request id for a new Run"})
		}
		// The same request again: one Run. Republish its latest events in
		// case the first delivery died between the KV write and the publish.
		in.log.Debug("duplicate submit", zap.String("run_id", run.ID))
		return in.runs.PublishEvents(ctx, run.Outbox)
	}
	in.log.Debug("run accepted", zap.String("run_id", run.ID), zap.String("request_id", req.RequestID))
	if run.Waiting == "" {
		in.sched.Poke() // not decided at intake: the scheduler's turn
	}
	return nil
}

// resolve asks the catalog for the Run's artifacts, once, at intake: the
// Run keeps what they named then.
func (in *Intake) resolve(ctx context.Context, req schemas.RunRequest) ([]schemas.ArtifactMount, error) {
	if len(req.Artifacts) == 0 {
		return nil, nil
	}
	if in.artifacts == nil {
		return nil, &schemas.Refusal{Code: schemas.CodeArtifactUnknown, Field: "artifacts",
			Reason: "this control plane serves no artifact catalog; submit the Run without artifacts"}
	}
	return in.artifacts.Resolve(ctx, req.Artifacts)
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
	if len(r.Ulimits) == 0 {
		r.Ulimits = nil
	}
	if len(r.Artifacts) == 0 {
		r.Artifacts = nil
	}
	if len(r.SecretEnv) == 0 {
		r.SecretEnv = nil
	}
	if len(r.SecretFiles) > 0 {
		r.SecretFiles = append([]schemas.SecretFileRef(nil), r.SecretFiles...)
		for i := range r.SecretFiles {
			r.SecretFiles[i].Mode = r.SecretFiles[i].FileMode() // 0 and 0400 ask for the same file
		}
	} else {
		r.SecretFiles = nil
	}
	r.Network = schemas.NetworkModeOf(r.Network)
	r.Version = 0
	return r
}

// reject publishes a coded rejected event. It goes on the subject of the Run
// the request id would have named, so a producer watching its own Run sees
// why; input without a usable request id goes under "rejected".
func (in *Intake) reject(ctx context.Context, m jetstream.Msg, requestID string, ref *schemas.Refusal) error {
	in.rejected.Add(1)
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
		Code: ref.Code, Field: ref.Field, Message: ref.Reason, At: in.now(),
	}
	in.log.Info("request refused", zap.String("subject", m.Subject()), zap.String("code", string(ref.Code)), zap.String("field", ref.Field))
	return in.runs.PublishEvent(ctx, ev, "rejected:"+strconv.FormatUint(meta.Sequence.Stream, 10))
}

// cancel marks a Run for cancellation and stops it where it runs.
func (in *Intake) cancel(ctx context.Context, m jetstream.Msg, c schemas.CancelRun, redelivered bool) error {
	run, err := in.runs.Advance(ctx, c.RunID, lifecycle.Cancellation{Reason: c.Reason, GraceSeconds: c.GraceSeconds}, redelivered)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return in.reject(ctx, m, "", &schemas.Refusal{Code: schemas.CodeRunNotFound, Field: "run_id", Reason: "no Run " + c.RunID + "; check the id with `warmfleet run list`"})
	case errors.Is(err, lifecycle.ErrNoChange):
		return nil
	case err != nil:
		return err
	}
	if !run.Phase.Terminal() {
		return in.dispatch.Stop(ctx, run, "cancelled")
	}
	return nil
}
