// Package nodecreds is what every per-use credential service shares
// (registry credentials, artifact source credentials): the asking node's
// current, live session checked against wf_nodes, and whether an active
// Run booked on the node wants the thing asked for, read from wf_runs when
// this replica's cache has not seen the booking yet; and the per-node rate
// limit each service applies before it does work for a node (Limiter).
// The services answer on the request server (controlplane/requests).
package nodecreds

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/schemas"
)

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

func refusal(code schemas.Code, field, format string, args ...any) *schemas.Refusal {
	return &schemas.Refusal{Code: code, Field: field, Reason: fmt.Sprintf(format, args...)}
}
