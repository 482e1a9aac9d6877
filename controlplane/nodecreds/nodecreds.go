// Package nodecreds is what every per-use credential service shares
// (registry credentials, artifact source credentials): a request decoded,
// validated and answered by a pool of workers in the control plane's queue
// group; the asking node's current, live session checked against
// wf_nodes; and whether an active Run booked on the node wants the thing
// asked for, read from wf_runs when this replica's cache has not seen the
// booking yet.
package nodecreds

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/schemas"
)

// Workers bounds how many credential requests one service of one replica
// answers at once (a registry helper may take its whole timeout).
const Workers = 16

// Gate checks who asks: the node's current session, with a live lease,
// and its booked Runs.
type Gate struct {
	cache           *cache.Cache
	nodesKV, runsKV jetstream.KeyValue
	now             func() time.Time
}

// NewGate returns a Gate over the control plane's cache and buckets.
func NewGate(c *cache.Cache, nodesKV, runsKV jetstream.KeyValue, now func() time.Time) *Gate {
	return &Gate{cache: c, nodesKV: nodesKV, runsKV: runsKV, now: now}
}

// Now is the gate's clock.
func (g *Gate) Now() time.Time { return g.now() }

// Session refuses a request that did not come on the node's own subject
// (own) or not from node nodeID's current session (token) with a live
// lease; what names the credential for the refusal's reason. Nil admits.
func (g *Gate) Session(ctx context.Context, subject, own, nodeID string, token uint64, what string) *schemas.Refusal {
	if subject != own {
		return &schemas.Refusal{Code: schemas.CodeWrongNode, Field: "node_id", Reason: "a node asks for " + what + " on its own subject, " + own}
	}
	node, err := g.node(ctx, nodeID, token)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return refusal(schemas.CodeUnknownNode, "node_id", "node %s is not enrolled; enroll it before it asks for %s", nodeID, what)
	case err != nil:
		return refusal(schemas.CodeInternal, "", "the node registry could not be read (%v); ask again", err)
	case token != node.FencingToken:
		return refusal(schemas.CodeStaleFencingToken, "fencing_token", "token %d is not node %s's current session (%d); only the current session gets %s",
			token, nodeID, node.FencingToken, what)
	case !node.Live(g.now()):
		return refusal(schemas.CodeSessionExpired, "", "node %s's lease has lapsed; it gets %s again once it heartbeats", nodeID, what)
	}
	return nil
}

// node returns the node's record from the cache, or from wf_nodes when the
// request names a newer session than the cache has seen yet (this
// replica's watch may lag the enrollment).
func (g *Gate) node(ctx context.Context, nodeID string, token uint64) (schemas.NodeRecord, error) {
	n, ok := g.cache.Node(nodeID)
	if ok && token <= n.FencingToken {
		return n, nil
	}
	var rec schemas.NodeRecord
	rev, err := bus.GetJSON(ctx, g.nodesKV, nodeID, &rec)
	if err != nil {
		return schemas.NodeRecord{}, err
	}
	g.cache.NoteNode(rec, rev)
	n, _ = g.cache.Node(nodeID)
	return n, nil
}

// Booked says whether r is booked on nodeID in a phase from placed
// (queued included) to running: a live reason to fetch what it needs.
func Booked(r *schemas.Run, nodeID string) bool {
	if r.NodeID != nodeID {
		return false
	}
	switch r.Phase {
	case schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning:
		return true
	}
	return false
}

// BookedRun returns an active Run booked on nodeID for which match says
// yes: from the cache, else, when runID is named, from wf_runs (this
// replica's watch may not have seen the booking yet). Nil when none.
func (g *Gate) BookedRun(ctx context.Context, nodeID, runID string, match func(*schemas.Run) bool) *schemas.Run {
	for _, r := range g.cache.ActiveRuns() {
		if Booked(r, nodeID) && match(r) {
			return r
		}
	}
	if runID == "" {
		return nil
	}
	var r schemas.Run
	if _, err := bus.GetJSON(ctx, g.runsKV, runID, &r); err != nil || !Booked(&r, nodeID) || !match(&r) {
		return nil
	}
	return &r
}

// Validated is a request type whose pointer validates it.
type Validated[T any] interface {
	*T
	Validate() error
}

// Server answers one credential subject.
type Server[T any, PT Validated[T], R any] struct {
	Conn    *nats.Conn
	Subject string // the wildcard subject served, e.g. bus.SubjectRegistryCredentials
	What    string // "registry credential": for logs and refusals
	// Answer decides a valid request that came on subject.
	Answer func(ctx context.Context, subject string, req T) schemas.Reply[R]
	// Refused counts requests refused here (undecodable or invalid).
	Refused *atomic.Int64
	Log     *zap.Logger
}

// Serve answers requests in the control plane's queue group until ctx
// ends or stop is called, by a pool of workers that wg owns, so a slow
// answer holds up no other request.
func (s *Server[T, PT, R]) Serve(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	pool := keyed.NewPool(ctx, wg, keyed.PoolOptions{Workers: Workers, Queue: Workers * 4}, s.Handle)
	subs, err := bus.QueueSubscribeAll(s.Conn, map[string]nats.MsgHandler{
		// Keyed by reply inbox only to spread the load.
		s.Subject: func(m *nats.Msg) { pool.Submit(m.Reply, m) },
	})
	if err != nil {
		return nil, err
	}
	return subs.Stop, nil
}

// Handle decodes, validates and answers one request, replying in its
// encoding. Input that is not a valid request is refused with its code.
func (s *Server[T, PT, R]) Handle(ctx context.Context, m *nats.Msg) {
	var req T
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = PT(&req).Validate()
	}
	var rep schemas.Reply[R]
	if err != nil {
		rep.Refusal = schemas.RefusalOfInput(err, "body is not a "+s.What+" request")
		if s.Refused != nil {
			s.Refused.Add(1)
		}
		s.Log.Info(s.What+" refused", zap.String("subject", m.Subject), zap.String("code", string(rep.Refusal.Code)),
			zap.String("reason", rep.Refusal.Reason))
	} else {
		rep = s.Answer(ctx, m.Subject, req)
	}
	if err := bus.Respond(m, enc, rep); err != nil {
		s.Log.Error("reply", zap.String("subject", m.Subject), zap.Error(err))
	}
}

func refusal(code schemas.Code, field, format string, args ...any) *schemas.Refusal {
	return &schemas.Refusal{Code: code, Field: field, Reason: fmt.Sprintf(format, args...)}
}
