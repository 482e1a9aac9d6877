package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/runlog"
	"github.com/warmfleet/warmfleet/schemas"
)

// history is where the CLI reads Runs, their events and their output. The
// operator reads JetStream directly, across tenants; a producer, whose
// login has no JetStream API, asks its tenant's read services
// (wf.tenant.<tenant>.runs.get, .runs.list, .runs.read).
type history struct {
	conn *bus.Conn
	// tenant is a producer's tenant; "" for the operator.
	tenant string
}

// anyTenant is the tenant token of the operator's reads: a Run id names
// one Run whatever its tenant.
const anyTenant = "*"

// askTimeout bounds a producer's get or list: a request its login may not
// publish (another tenant's service) is never answered.
const askTimeout = 15 * time.Second

func (g *globals) history(conn *bus.Conn) history {
	if g.identity() == bus.OperatorUser {
		return history{conn: conn}
	}
	return history{conn: conn, tenant: g.tenant}
}

// run reads Run id.
func (h history) run(ctx context.Context, id string) (schemas.Run, error) {
	if h.tenant == "" {
		return getRun(ctx, h.conn, id)
	}
	return askTenant[schemas.Run](ctx, h, bus.TenantRunsGet, schemas.RunsGetRequest{RunID: id})
}

// runs reads the Runs, newest first, in phase unless it is "", and how
// many more a producer's reply left off.
func (h history) runs(ctx context.Context, phase string) ([]schemas.Run, int, error) {
	if h.tenant == "" {
		runs, err := listRuns(ctx, h.conn)
		if phase != "" {
			runs = slices.DeleteFunc(runs, func(r schemas.Run) bool { return string(r.Phase) != phase })
		}
		return runs, 0, err
	}
	req := schemas.RunsListRequest{Phase: schemas.Phase(phase), Limit: schemas.MaxRunsList}
	if err := req.Validate(); err != nil {
		return nil, 0, fmt.Errorf("--phase: %w", err)
	}
	list, err := askTenant[schemas.RunsList](ctx, h, bus.TenantRunsList, req)
	return list.Runs, list.LeftOff, err
}

// askTenant sends req to the producer's tenant's service op and returns
// its answer, or its refusal.
func askTenant[T any](ctx context.Context, h history, op string, req any) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	rep, err := admin[T](ctx, h.conn, bus.TenantSubject(h.tenant, op), req)
	if errors.Is(err, nats.ErrPermissionViolation) {
		return rep, fmt.Errorf("this login may not ask tenant %q's services: set --tenant (or %s) to the tenant of the login's producer: %w", h.tenant, envTenant, err)
	}
	return rep, err
}

// events is the source of Run runID's events.
func (h history) events(runID string) runlog.Source {
	if h.tenant == "" {
		return runlog.StreamSource(h.conn.JS, bus.StreamEvents, bus.RunEventsSubject(anyTenant, runID))
	}
	return runlog.PageSource(h.conn.NC, h.tenant, schemas.RunsReadRequest{Kind: schemas.ReadEvents, RunID: runID})
}

// logs is the source of Run runID's output.
func (h history) logs(runID string) runlog.Source {
	if h.tenant == "" {
		return runlog.StreamSource(h.conn.JS, bus.StreamLogs, bus.RunLogsSubject(anyTenant, runID))
	}
	return runlog.PageSource(h.conn.NC, h.tenant, schemas.RunsReadRequest{Kind: schemas.ReadLogs, RunID: runID})
}

// ended returns a channel closed once Run r is in a terminal phase (or
// gone, or its events cannot be read), watching until ctx ends: the
// operator watches wf_runs, a producer follows the Run's events.
func (h history) ended(ctx context.Context, r schemas.Run) (<-chan struct{}, error) {
	if h.tenant == "" || r.Phase.Terminal() {
		return runEnded(ctx, h.conn.JS, r)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = readEvents(ctx, h.events(r.ID), terminal, func(schemas.RunEvent) {})
	}()
	return done, nil
}

// readEvents calls each with the events src holds, in order (Run events,
// or session events). With until nil it returns once it has read what is
// stored; otherwise it keeps reading, as they arrive, until an event for
// which until is true, or ctx ends. A message that is not an event is
// skipped.
func readEvents[E any](ctx context.Context, src runlog.Source, until func(E) bool, each func(E)) error {
	follow := until != nil
	var last, seen uint64
	if !follow {
		var err error
		if last, _, err = src.Last(ctx); err != nil || last == 0 {
			return err
		}
	}
	cur, err := src.Open(ctx, 0, time.Time{})
	if err != nil {
		return err
	}
	defer cur.Stop()
	for {
		wait := time.Duration(0) // follow: until ctx ends
		if !follow {
			wait = time.Second
		}
		m, ok, err := cur.Next(ctx, wait)
		if err != nil {
			return err
		}
		if !ok { // what it waits for may have been removed by the stream's limits
			now, _, err := src.Last(ctx)
			if err != nil || now <= seen {
				return err
			}
			continue
		}
		seen = m.Seq
		var ev E
		if codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &ev) == nil {
			each(ev)
			if follow && until(ev) {
				return nil
			}
		}
		if !follow && m.Seq >= last {
			return nil
		}
	}
}
