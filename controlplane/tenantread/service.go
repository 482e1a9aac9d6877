// Package tenantread is how a producer reads its own tenant's history: the
// control plane's per-tenant read services wf.tenant.<tenant>.runs.get,
// .runs.list and .runs.read. A producer's login has no JetStream API (a
// direct get of KV_wf_runs or WF_EVENTS would reach every tenant), so the
// control plane reads with its own rights, building every key it checks and
// every subject it reads from the tenant of the request's subject, which
// the auth callout lets a producer publish for its own tenant only.
package tenantread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/schemas"
)

// readPool bounds runs.read's requests answered at once: a follower's long
// poll holds a worker up to schemas.MaxReadWait, so there are many.
var readPool = keyed.PoolOptions{Workers: 256, Queue: 1024}

// Service answers the per-tenant read services on the request server.
type Service struct {
	conn    *bus.Conn
	runs    jetstream.KeyValue
	tenants []string // the configured tenants; nil accepts any valid name
	log     *zap.Logger
}

// New returns the service over wf_runs (runs), WF_EVENTS and WF_LOGS.
// tenants, when not empty, are the only tenants it answers for; another is
// refused tenant_unknown.
func New(conn *bus.Conn, runs jetstream.KeyValue, tenants []string, log *zap.Logger) *Service {
	return &Service{conn: conn, runs: runs, tenants: tenants, log: log}
}

// Serve subscribes to every tenant's runs.get, runs.list and runs.read
// until ctx ends or stop is called; the request workers are owned by wg.
func (s *Service) Serve(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	read := requests.Coded(bus.TenantSubject("*", bus.TenantRunsRead), "body is not a RunsReadRequest", (*schemas.RunsReadRequest).Validate, s.read, s.log)
	read.Pool = readPool
	return requests.Serve(ctx, wg, s.conn.NC,
		requests.Coded(bus.TenantSubject("*", bus.TenantRunsGet), "body is not a RunsGetRequest", (*schemas.RunsGetRequest).Validate, s.get, s.log),
		requests.Coded(bus.TenantSubject("*", bus.TenantRunsList), "body is not a RunsListRequest", (*schemas.RunsListRequest).Validate, s.list, s.log),
		read)
}

// tenantOf is the tenant a request's subject names (wf.tenant.<t>.<op>).
func (s *Service) tenantOf(subject string) (string, error) {
	t := bus.SubjectTenant(subject)
	if err := schemas.ValidateTenant("tenant", t); err != nil {
		return "", err
	}
	if len(s.tenants) > 0 && !slices.Contains(s.tenants, t) {
		return "", &schemas.Refusal{Code: schemas.CodeTenantUnknown, Field: "tenant",
			Reason: "this control plane has no such tenant; its tenants come from serve's --producer-tokens-file"}
	}
	return t, nil
}

// notFound is the one refusal of a Run that is missing or another
// tenant's: it never says which.
func notFound(tenant, runID string) error {
	return &schemas.Refusal{Code: schemas.CodeRunNotFound, Field: "run_id",
		Reason: fmt.Sprintf("tenant %s has no Run %s; `warmfleet run list --tenant %s` shows its Runs", tenant, runID, tenant)}
}

// get answers one Run of the subject's tenant, its outbox left out.
func (s *Service) get(ctx context.Context, subject string, req schemas.RunsGetRequest) (schemas.Run, error) {
	tenant, err := s.tenantOf(subject)
	if err != nil {
		return schemas.Run{}, err
	}
	r, err := s.run(ctx, tenant, req.RunID)
	return r, s.logged(subject, err)
}

// run reads Run runID of tenant from wf_runs.
func (s *Service) run(ctx context.Context, tenant, runID string) (schemas.Run, error) {
	var r schemas.Run
	if _, err := bus.GetJSON(ctx, s.runs, runID, &r); err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return schemas.Run{}, notFound(tenant, runID)
		}
		return schemas.Run{}, fmt.Errorf("tenantread: run %s: %w", runID, err)
	}
	if r.TenantOf() != tenant {
		return schemas.Run{}, notFound(tenant, runID)
	}
	r.Outbox = nil
	return r, nil
}

// list answers the subject's tenant's Runs, newest first, as many as the
// limit and the reply's size bound allow, and how many it left off.
func (s *Service) list(ctx context.Context, subject string, req schemas.RunsListRequest) (schemas.RunsList, error) {
	tenant, err := s.tenantOf(subject)
	if err != nil {
		return schemas.RunsList{}, err
	}
	runs, sizes, err := s.tenantRuns(ctx, tenant, req.Phase)
	if err != nil {
		return schemas.RunsList{}, s.logged(subject, err)
	}
	limit := req.Limit
	if limit == 0 {
		limit = schemas.DefaultRunsList
	}
	budget, n := replyBudget(s.conn.NC), 0
	for n < len(runs) && n < limit && budget >= sizes[n] {
		budget -= sizes[n]
		n++
	}
	return schemas.RunsList{Runs: runs[:n], LeftOff: len(runs) - n}, nil
}

// tenantRuns reads every Run of tenant (in phase, unless "") from wf_runs,
// newest first, with the size of each stored value.
func (s *Service) tenantRuns(ctx context.Context, tenant string, phase schemas.Phase) ([]schemas.Run, []int, error) {
	w, err := s.runs.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, nil, fmt.Errorf("tenantread: list runs: %w", err)
	}
	defer func() { _ = w.Stop() }()
	type sized struct {
		run  schemas.Run
		size int
	}
	var found []sized
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case e = <-w.Updates():
		}
		if e == nil {
			break // every current value has been read
		}
		var r schemas.Run
		if json.Unmarshal(e.Value(), &r) != nil || r.TenantOf() != tenant || (phase != "" && r.Phase != phase) {
			continue
		}
		r.Outbox = nil
		found = append(found, sized{r, len(e.Value())})
	}
	slices.SortFunc(found, func(a, b sized) int { return b.run.CreatedAt.Compare(a.run.CreatedAt) })
	runs, sizes := make([]schemas.Run, len(found)), make([]int, len(found))
	for i, f := range found {
		runs[i], sizes[i] = f.run, f.size
	}
	return runs, sizes, nil
}

// replyBudget is how many bytes of values a reply may carry: the server's
// max payload less room for the envelope, and JSON's base64 of bodies.
func replyBudget(nc *nats.Conn) int {
	return int(nc.MaxPayload())/2 - 4<<10
}

// logged logs a failure that is the control plane's, not the request's.
func (s *Service) logged(subject string, err error) error {
	if err != nil && schemas.AsRefusal(err).Code == schemas.CodeInternal {
		s.log.Warn("tenant read failed", zap.String("subject", subject), zap.Error(err))
	}
	return err
}
