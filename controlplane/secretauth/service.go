// Package secretauth hands a node, at the launch of an attempt booked on
// it, the values of the secrets its Run references: only to the node's
// current, live session, only for an attempt booked there now, at the
// node's rate limit (all three as controlplane/nodecreds checks them for
// every per-use credential). Values are opened from the Run's tenant's
// store at the moment of the answer and go out by core request/reply only:
// the service never logs, stores or echoes one.
package secretauth

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/nodecreds"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/schemas"
)

// Opener opens one of a tenant's secrets (controlplane/secrets.Store).
type Opener interface {
	Open(ctx context.Context, tenant, name string) ([]byte, error)
}

// secretUnknown matches (errors.Is) an Opener's refusal of a secret the
// tenant does not hold, whatever field it names.
var secretUnknown error = &schemas.Refusal{Code: schemas.CodeSecretUnknown}

// Service answers wf.node.<id>.credentials.secret.
type Service struct {
	gate   *nodecreds.Gate
	limit  *nodecreds.Limiter
	server *requests.Server[schemas.SecretRequest, schemas.Reply[schemas.SecretValues]]
	nc     *nats.Conn
	store  Opener
	log    *zap.Logger

	given, refused atomic.Int64
}

// NewService returns the secret delivery service over store. limit bounds
// each node's requests (nodecreds.DefaultLimit when zero).
func NewService(conn *bus.Conn, c *cache.Cache, nodesKV, runsKV jetstream.KeyValue, store Opener, limit nodecreds.Limit, now func() time.Time, log *zap.Logger) *Service {
	s := &Service{gate: nodecreds.NewGate(c, nodesKV, runsKV, now), limit: nodecreds.NewLimiter(limit, now), nc: conn.NC,
		store: store, log: log.Named("secretauth")}
	s.server = &requests.Server[schemas.SecretRequest, schemas.Reply[schemas.SecretValues]]{
		Subject: bus.SubjectSecretCredentials, What: "secret request", Malformed: "body is not a secret request",
		Validate: (*schemas.SecretRequest).Validate, Answer: s.Answer, Refuse: requests.Refusal[schemas.SecretValues],
		Pool: requests.DefaultPool(), Refused: &s.refused, Log: s.log}
	return s
}

// Given counts deliveries answered; Refused counts requests refused.
func (s *Service) Given() int64   { return s.given.Load() }
func (s *Service) Refused() int64 { return s.refused.Load() }

// Serve answers requests in the control plane's queue group until ctx
// ends or stop is called.
func (s *Service) Serve(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	return requests.Serve(ctx, wg, s.nc, s.server)
}

// Answer decides one valid request that came on subject: a coded refusal,
// or the values of every secret the booked attempt's Run references, in
// its order. A refusal is logged with its reason, which names secrets by
// name only; a value never is.
func (s *Service) Answer(ctx context.Context, subject string, req schemas.SecretRequest) schemas.Reply[schemas.SecretValues] {
	refuse := func(r *schemas.Refusal) schemas.Reply[schemas.SecretValues] {
		s.refused.Add(1)
		s.log.Info("secret request refused", zap.String("node_id", req.NodeID), zap.Uint64("fencing_token", req.FencingToken),
			zap.String("run_id", req.RunID), zap.String("attempt_id", req.AttemptID), zap.String("code", string(r.Code)),
			zap.String("field", r.Field), zap.String("reason", r.Reason))
		return schemas.Reply[schemas.SecretValues]{Refusal: r}
	}
	if r := s.gate.Session(ctx, subject, bus.NodeSecretCredentials(req.NodeID), req.NodeID, req.FencingToken, "secrets"); r != nil {
		return refuse(r)
	}
	if r := s.limit.Allow(req.NodeID, "secrets"); r != nil {
		return refuse(r)
	}
	run := s.gate.BookedRun(ctx, req.NodeID, req.RunID, func(r *schemas.Run) bool { return r.ID == req.RunID && r.AttemptID == req.AttemptID })
	if run == nil {
		return refuse(&schemas.Refusal{Code: schemas.CodeNotBookedHere, Field: "attempt_id",
			Reason: fmt.Sprintf("attempt %s of Run %s is not booked on node %s now; secrets are given only for an attempt booked on the node that asks", req.AttemptID, req.RunID, req.NodeID)})
	}
	vals, r := s.open(ctx, run)
	if r != nil {
		return refuse(r)
	}
	s.given.Add(1)
	s.log.Debug("secrets given", zap.String("node_id", req.NodeID), zap.String("run_id", run.ID), zap.String("attempt_id", req.AttemptID),
		zap.Stringer("values", vals))
	return schemas.Reply[schemas.SecretValues]{OK: &vals}
}

// open reads the value of each of run's references from its tenant's
// store. A secret removed since intake is secret_unknown naming the
// reference's field; a store that cannot answer is internal (ask again).
func (s *Service) open(ctx context.Context, run *schemas.Run) (schemas.SecretValues, *schemas.Refusal) {
	tenant := run.TenantOf()
	req := run.Request
	var out schemas.SecretValues
	total := 0
	get := func(field, name string) ([]byte, *schemas.Refusal) {
		v, err := s.store.Open(ctx, tenant, name)
		switch {
		case errors.Is(err, secretUnknown):
			return nil, &schemas.Refusal{Code: schemas.CodeSecretUnknown, Field: field,
				Reason: "tenant " + tenant + " holds no secret " + name + " any more; set it again and resubmit the Run"}
		case err != nil:
			s.log.Warn("secret store failed", zap.String("tenant", tenant), zap.String("secret", name), zap.Error(err))
			return nil, &schemas.Refusal{Code: schemas.CodeInternal, Field: field, Reason: "the secret store could not open " + name + "; ask again"}
		}
		if total += len(v); total > schemas.MaxSecretValuesBytes {
			return nil, &schemas.Refusal{Code: schemas.CodeSecretTooLarge, Field: field,
				Reason: fmt.Sprintf("the Run's secrets total more than %d bytes, the most one launch is given; put large values in an artifact", schemas.MaxSecretValuesBytes)}
		}
		return v, nil
	}
	for i, e := range req.SecretEnv {
		v, r := get("secret_env["+strconv.Itoa(i)+"].secret", e.Secret)
		if r != nil {
			return schemas.SecretValues{}, r
		}
		out.Env = append(out.Env, schemas.SecretEnvValue{Name: e.Name, Value: v})
	}
	for i, f := range req.SecretFiles {
		v, r := get("secret_files["+strconv.Itoa(i)+"].secret", f.Secret)
		if r != nil {
			return schemas.SecretValues{}, r
		}
		out.Files = append(out.Files, schemas.SecretFileValue{Path: f.Path, Mode: f.FileMode(), Value: v})
	}
	if err := out.Validate(); err != nil {
		// A value the node would refuse (an env value holding NUL): the
		// refusal names the field, never the value.
		var r *schemas.Refusal
		if errors.As(err, &r) {
			return schemas.SecretValues{}, r
		}
		return schemas.SecretValues{}, &schemas.Refusal{Code: schemas.CodeInternal, Reason: err.Error()}
	}
	return out, nil
}
