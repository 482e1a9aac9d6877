// Package intake takes producers' requests off each tenant's intake stream
// (bus.RunsStream): a valid submit becomes a stored Run of the tenant and
// identity its subject names (once per request id of the tenant), a cancel
// marks its tenant's Run and stops it where it runs, and anything else is
// answered with a coded rejected event on the tenant's event subjects.
package intake

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/policy"
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
	// Resolve answers a Run's artifact uses in order, with records of the
	// Run's tenant and shared ones only. A use the catalog cannot answer
	// is a *schemas.Refusal; any other error is transient.
	Resolve(ctx context.Context, tenant string, uses []schemas.ArtifactUse) ([]schemas.ArtifactMount, error)
}

// Intake handles WF_RUNS messages.
type Intake struct {
	runs      *runs.Store
	sched     Scheduler
	dispatch  *dispatch.Dispatcher
	artifacts ArtifactResolver
	secrets   SecretChecker
	policy    policy.Source
	now       func() time.Time
	log       *zap.Logger
	rejected  atomic.Int64
}

// New returns an intake writing Runs to store, resolving their artifacts
// through artifacts and checking the secrets they reference in secrets
// (nil: none held, and a Run referencing one is refused), and its priority
// class and retry policy in pol (nil: the empty policy).
func New(store *runs.Store, sched Scheduler, d *dispatch.Dispatcher, artifacts ArtifactResolver, secrets SecretChecker, pol policy.Source, now func() time.Time, log *zap.Logger) *Intake {
	if pol == nil {
		pol = policy.Static(schemas.SchedulingPolicy{}, "")
	}
	return &Intake{runs: store, sched: sched, dispatch: d, artifacts: artifacts, secrets: secrets, policy: pol, now: now, log: log}
}

// Rejected counts refused intake messages.
func (in *Intake) Rejected() int64 { return in.rejected.Load() }

// Job is one intake message, decoded once by the consumer's callback
// so that it can be routed by Run id: a Run's submit and cancel go to the
// same intake worker and keep their stream order.
type Job struct {
	m jetstream.Msg
	// Key routes the job: the Run id, or refusedKey for refused input.
	Key string
	// tenant and identity are read off the subject (bus.SubmitSubject):
	// the auth callout lets an identity publish only its own tenant's and
	// name's subjects.
	tenant, identity string
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

// Parse decodes and validates one intake message; redelivered says the
// message was delivered before.
func Parse(m jetstream.Msg, redelivered bool) Job {
	job := Job{m: m, redelivered: redelivered}
	tenant, identity, verb, ok := bus.ParseIntakeSubject(m.Subject())
	if !ok || !schemas.ValidTenant(tenant) {
		job.refusal = &schemas.Refusal{Code: schemas.CodeMalformed, Field: "subject",
			Reason: "not an intake subject; submit on wf.runs.<tenant>.<identity>.submit and cancel on wf.runs.<tenant>.<identity>.cancel"}
		verb = ""
	}
	job.tenant, job.identity = tenant, identity
	switch verb {
	case "submit":
		req, _, err := schemas.DecodeRunRequest(m.Headers(), m.Data())
		job.requestID = req.RequestID
		if err != nil {
			job.refusal = schemas.AsRefusal(err)
		} else {
			job.submit = &req
		}
		if job.requestID != "" {
			job.Key = schemas.RunIDFor(tenant, job.requestID)
		}
	case "cancel":
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
		if err := c.Validate(tenant); err != nil {
			job.refusal, job.requestID = schemas.AsRefusal(err), c.RequestID
			break
		}
		job.cancel = &c
	}
	if job.refusal != nil {
		// Refusals go through one worker, so they are answered in stream
		// order (a producer reading its rejections sees them in the order
		// it sent), and a flood of bad input holds up one worker, not all.
		job.Key = refusedKey
	}
	return job
}

// Handle handles one intake message on an intake worker. Refused
// input is answered with a rejected event and terminated; a transient
// failure is left unacked so JetStream redelivers it under the consumer's
// BackOff.
func (in *Intake) Handle(ctx context.Context, job Job) {
	m := job.m
	var err error
	switch {
	case job.refusal != nil:
		err = in.reject(ctx, m, job.tenant, job.requestID, job.refusal)
	case job.submit != nil:
		err = in.submit(ctx, m, job.tenant, job.identity, *job.submit)
	case job.cancel != nil:
		err = in.cancel(ctx, m, job.tenant, *job.cancel, job.redelivered)
	}
	if err != nil {
		in.log.Warn("intake will retry", zap.String("subject", m.Subject()), zap.Error(err))
		_ = m.Nak() // redelivered after the consumer's BackOff
		return
	}
	_ = m.Ack()
}

// submit turns one valid RunRequest of tenant, sent by identity, into a
// stored Run, or a rejection.
func (in *Intake) submit(ctx context.Context, m jetstream.Msg, tenant, identity string, req schemas.RunRequest) error {
	pol := in.policy.Current()
	err := checkPriority(pol, req)
	if err == nil {
		err = in.checkSecrets(ctx, tenant, req)
	}
	var mounts []schemas.ArtifactMount
	if err == nil {
		mounts, err = in.resolve(ctx, tenant, req)
	}
	var ref *schemas.Refusal
	if errors.As(err, &ref) {
		// A submit delivered again may name an artifact, a secret or a
		// priority class removed since its Run was accepted: the Run
		// stands, and is handled as a duplicate below.
		stored, found, gerr := in.runs.Stored(ctx, schemas.RunIDFor(tenant, req.RequestID))
		if gerr != nil {
			return gerr
		}
		if !found {
			return in.reject(ctx, m, tenant, req.RequestID, ref)
		}
		mounts = stored.Artifacts
	} else if err != nil {
		return err // the catalog is unavailable: redelivered
	}
	run, dup, err := in.runs.Create(ctx, tenant, identity, req, mounts, runs.Policy{Retry: retryOf(pol, tenant, req), Spot: spotOf(pol, tenant, req)}, in.sched.AtIntake)
	if err != nil {
		return err
	}
	if dup {
		// The id hashes the tenant, so a duplicate is this tenant's own
		// Run (which of its identities sent it again does not matter);
		// should another tenant's ever share the id, nothing of it is told.
		if run.TenantOf() != tenant {
			return in.reject(ctx, m, tenant, req.RequestID, &schemas.Refusal{Code: schemas.CodeRequestIDConflict, Field: "request_id",
				Reason: "this request id cannot name a new Run; use another request id"})
		}
		if !reflect.DeepEqual(normalise(run.Request), normalise(req)) {
			return in.reject(ctx, m, tenant, req.RequestID, &schemas.Refusal{Code: schemas.CodeRequestIDConflict, Field: "request_id",
				Reason: "this request id already names a different Run (" + run.ID + "); use a new request id for a new Run"})
		}
		// The same request again: one Run. Republish its latest events in
		// case the first delivery died between the KV write and the publish.
		in.log.Debug("duplicate submit", zap.String("run_id", run.ID))
		return in.runs.PublishEvents(ctx, run.TenantOf(), run.Outbox)
	}
	in.log.Debug("run accepted", zap.String("run_id", run.ID), zap.String("request_id", req.RequestID))
	if run.Waiting == "" {
		in.sched.Poke() // not decided at intake: the scheduler's turn
	}
	return nil
}

// resolve asks the catalog for the artifacts of a Run of tenant, once, at
// intake: the Run keeps what they named then.
func (in *Intake) resolve(ctx context.Context, tenant string, req schemas.RunRequest) ([]schemas.ArtifactMount, error) {
	if len(req.Artifacts) == 0 {
		return nil, nil
	}
	if in.artifacts == nil {
		return nil, &schemas.Refusal{Code: schemas.CodeArtifactUnknown, Field: "artifacts",
			Reason: "this control plane serves no artifact catalog; submit the Run without artifacts"}
	}
	return in.artifacts.Resolve(ctx, tenant, req.Artifacts)
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

// reject publishes a coded rejected event on tenant's event subjects. It
// goes on the subject of the Run the request id would have named, so a
// producer watching its own Run sees why; input without a usable request
// id goes under "rejected". A subject too malformed to name its tenant is
// answered on the tenant whose stream held it.
func (in *Intake) reject(ctx context.Context, m jetstream.Msg, tenant, requestID string, ref *schemas.Refusal) error {
	in.rejected.Add(1)
	meta, err := m.Metadata()
	if err != nil {
		return err
	}
	if !schemas.ValidTenant(tenant) {
		tenant, _ = strings.CutPrefix(meta.Stream, bus.RunsStream(""))
	}
	if !schemas.ValidTenant(tenant) {
		tenant = schemas.DefaultTenant // a stream not of bus's making: operators read it
	}
	runID := "rejected"
	if requestID != "" && schemas.ValidateID("request_id", requestID, schemas.CodeInvalidRequestID) == nil {
		runID = schemas.RunIDFor(tenant, requestID)
	} else {
		requestID = ""
	}
	ev := schemas.RunEvent{
		RunID: runID, Type: schemas.EventRejected, RequestID: requestID,
		Code: ref.Code, Field: ref.Field, Message: ref.Reason, At: in.now(),
	}
	in.log.Info("request refused", zap.String("subject", m.Subject()), zap.String("code", string(ref.Code)), zap.String("field", ref.Field))
	// Each tenant's stream numbers its own messages: the tenant keeps two
	// tenants' rejections apart in WF_EVENTS' dedupe.
	return in.runs.PublishEvent(ctx, tenant, ev, "rejected:"+tenant+":"+strconv.FormatUint(meta.Sequence.Stream, 10))
}

// cancel marks tenant's Run for cancellation and stops it where it runs.
// Another tenant's Run is refused as not found, untouched: a producer
// learns nothing of Runs outside its tenant.
func (in *Intake) cancel(ctx context.Context, m jetstream.Msg, tenant string, c schemas.CancelRun, redelivered bool) error {
	t := tenantOnly{tenant: tenant, t: lifecycle.Cancellation{Reason: c.Reason, GraceSeconds: c.GraceSeconds}}
	run, err := in.runs.Advance(ctx, c.RunID, t, redelivered)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, errOtherTenant):
		return in.reject(ctx, m, tenant, "", &schemas.Refusal{Code: schemas.CodeRunNotFound, Field: "run_id",
			Reason: "no Run " + c.RunID + " in tenant " + tenant + "; check the id with `warmfleet run list` and the tenant with --tenant"})
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

// errOtherTenant: the Run belongs to another tenant than the request's.
var errOtherTenant = errors.New("the Run belongs to another tenant")

// tenantOnly applies t to a Run of tenant only: the check and the change
// are one CAS write, so no Run of another tenant is ever changed.
type tenantOnly struct {
	tenant string
	t      lifecycle.Transition
}

func (g tenantOnly) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.TenantOf() != g.tenant {
		return r, nil, errOtherTenant
	}
	return g.t.Apply(r)
}
