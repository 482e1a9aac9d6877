// Package ingest applies what node agents report on WF_OBS: workload
// phases and exits, command receipts, a node's full account
// (Reconciliation) and its facts. Reports from a superseded session are
// dropped, never applied late.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/schemas"
)

// FactsRecorder stores a node's facts on its registry record, under the
// session (fencing token) that reported them.
type FactsRecorder interface {
	RecordFacts(ctx context.Context, nodeID string, token uint64, f schemas.NodeFacts) error
}

// Prefetches takes what nodes report about operators' prefetches: their
// transfers' progress and their PrepareImage and PrepareArtifact receipts.
type Prefetches interface {
	Progress(nodeID string, p schemas.ImageProgress)
	Receipt(ctx context.Context, nodeID string, rc schemas.OperationReceipt) error
}

// Ingest applies node reports.
type Ingest struct {
	cache    *cache.Cache
	nodesKV  jetstream.KeyValue
	runs     *runs.Store
	dispatch *dispatch.Dispatcher
	facts    FactsRecorder
	prefetch Prefetches
	now      func() time.Time
	log      *zap.Logger

	fenced, stale, refused atomic.Int64
}

// New returns an ingest that moves Runs through store. nodesKV is
// wf_nodes, read when the cache cannot vouch for a report's session.
func New(c *cache.Cache, nodesKV jetstream.KeyValue, store *runs.Store, d *dispatch.Dispatcher, facts FactsRecorder, prefetch Prefetches, now func() time.Time, log *zap.Logger) *Ingest {
	return &Ingest{cache: c, nodesKV: nodesKV, runs: store, dispatch: d, facts: facts, prefetch: prefetch, now: now, log: log}
}

// Fenced counts reports dropped for a superseded session or a wrong
// subject; Stale counts workload reports older than their Run; Refused
// counts receipts and reports from a node's current session about an
// attempt booked on another node (schemas.CodeNotBookedHere).
func (g *Ingest) Fenced() int64  { return g.fenced.Load() }
func (g *Ingest) Stale() int64   { return g.stale.Load() }
func (g *Ingest) Refused() int64 { return g.refused.Load() }

// Handle applies one node report. Reports from a superseded
// session, or naming another node than the subject they came on, are
// dropped with a counted, logged reason; malformed ones are terminated.
func (g *Ingest) Handle(ctx context.Context, m jetstream.Msg, redelivered bool) {
	var o schemas.Observation
	if err := schemas.DecodeNodeMessage(codec.Detect(m.Headers(), m.Data()), m.Data(), &o); err != nil {
		g.log.Warn("malformed observation dropped", zap.String("subject", m.Subject()), zap.Error(err))
		_ = m.Term()
		return
	}
	if err := g.observe(ctx, m.Subject(), o, redelivered); err != nil {
		g.log.Warn("observation will retry", zap.String("node_id", o.NodeID), zap.Error(err))
		_ = m.Nak()
		return
	}
	_ = m.Ack()
}

func (g *Ingest) observe(ctx context.Context, subject string, o schemas.Observation, redelivered bool) error {
	if bus.SubjectNode(subject) != o.NodeID {
		return g.drop(o, "node_id does not match the subject it was published on")
	}
	node, ok, err := g.currentNode(ctx, o)
	switch {
	case err != nil:
		return err
	case !ok:
		return g.drop(o, "node is not enrolled")
	case o.FencingToken != node.FencingToken:
		return g.drop(o, "fencing token is not the node's current session")
	}
	now := g.now()
	switch o.Kind {
	case schemas.ObsWorkload:
		o.Workload.ReceivedAt = now
		return g.applyWorkload(ctx, node, *o.Workload, redelivered)
	case schemas.ObsReceipt:
		return g.applyReceipt(ctx, node, *o.Receipt, redelivered)
	case schemas.ObsReconciliation:
		return g.applyReconciliation(ctx, node, *o.Reconciliation, now, redelivered)
	case schemas.ObsFacts:
		return g.facts.RecordFacts(ctx, o.NodeID, o.FencingToken, *o.Facts)
	case schemas.ObsImageProgress:
		g.prefetch.Progress(node.NodeID, *o.ImageProgress)
	}
	return nil
}

// currentNode is the record o's session is judged by: the cache's when it
// holds the node at o's token or a newer one (tokens only rise), else the
// current one in wf_nodes. This replica's watch may lag an enrollment
// another replica wrote, and a report of the new session must not be
// dropped for it; a read that fails is an error, so the report is
// redelivered rather than acknowledged unjudged.
func (g *Ingest) currentNode(ctx context.Context, o schemas.Observation) (schemas.NodeRecord, bool, error) {
	if n, ok := g.cache.Node(o.NodeID); ok && o.FencingToken <= n.FencingToken {
		return n, true, nil
	}
	var rec schemas.NodeRecord
	rev, err := bus.GetJSON(ctx, g.nodesKV, o.NodeID, &rec)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return schemas.NodeRecord{}, false, nil
	case err != nil:
		return schemas.NodeRecord{}, false, fmt.Errorf("ingest: read node %s: %w", o.NodeID, err)
	}
	g.cache.NoteNode(rec, rev)
	return rec, true, nil
}

// refuse counts and logs, with its code, a report from a node's current
// session about an attempt booked on another node. Like a fenced one it is
// acknowledged and never applied.
func (g *Ingest) refuse(nodeID, runID, attemptID, kind string) {
	g.refused.Add(1)
	g.log.Warn("observation refused", zap.String("node_id", nodeID), zap.String("run_id", runID), zap.String("attempt_id", attemptID),
		zap.String("kind", kind), zap.String("code", string(schemas.CodeNotBookedHere)), zap.String("reason", "the attempt is booked on another node"))
}

// drop counts and logs a fenced or misaddressed report. It is not an error:
// the message is acked so it is never redelivered.
func (g *Ingest) drop(o schemas.Observation, why string) error {
	g.fenced.Add(1)
	g.log.Info("observation dropped", zap.String("node_id", o.NodeID), zap.Uint64("fencing_token", o.FencingToken),
		zap.String("kind", string(o.Kind)), zap.String("reason", why))
	return nil
}

// applyWorkload moves the Run by what its node saw.
func (g *Ingest) applyWorkload(ctx context.Context, node schemas.NodeRecord, w schemas.WorkloadObservation, redelivered bool) error {
	_, err := g.runs.Advance(ctx, w.RunID, lifecycle.Report{NodeID: node.NodeID, Workload: w}, redelivered)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		g.log.Info("report for an unknown run", zap.String("run_id", w.RunID), zap.String("node_id", node.NodeID))
		if w.Phase == schemas.WorkloadRunning || w.Phase == schemas.WorkloadStarting {
			return g.dispatch.StopAttempt(ctx, node.NodeID, w.RunID, w.AttemptID, 0, "unknown to the control plane")
		}
		return nil
	case errors.Is(err, lifecycle.ErrNotBookedHere):
		g.refuse(node.NodeID, w.RunID, w.AttemptID, string(schemas.ObsWorkload))
		if w.Phase == schemas.WorkloadRunning || w.Phase == schemas.WorkloadStarting {
			// Whatever the node runs under that id is not the booked attempt.
			return g.dispatch.StopAttempt(ctx, node.NodeID, w.RunID, w.AttemptID, 0, "attempt not booked on this node")
		}
		return nil
	case errors.Is(err, lifecycle.ErrIllegalTransition):
		g.log.Warn("report refused by the run state machine", zap.String("run_id", w.RunID), zap.Error(err))
		return nil
	case errors.Is(err, lifecycle.ErrSuperseded):
		// The node runs an attempt the Run has moved on from.
		return g.dispatch.StopAttempt(ctx, node.NodeID, w.RunID, w.AttemptID, 0, "attempt superseded")
	case errors.Is(err, lifecycle.ErrStaleReport):
		g.stale.Add(1)
		return nil
	case err != nil && !errors.Is(err, lifecycle.ErrNoChange):
		return err
	}
	return nil
}

// applyReconciliation squares the node's full account with the Runs booked
// on it: what runs there moves its Run; a Run whose launch the node applied
// but whose workload is gone (and whose exit never arrived) lost its
// attempt. Workloads the control plane does not know are stopped by
// applyWorkload.
func (g *Ingest) applyReconciliation(ctx context.Context, node schemas.NodeRecord, rec schemas.Reconciliation, now time.Time, redelivered bool) error {
	present := map[string]bool{}
	for _, w := range rec.Workloads {
		w.ReceivedAt = now
		present[w.AttemptID] = true
		if err := g.applyWorkload(ctx, node, w, redelivered); err != nil {
			return err
		}
	}
	applied := map[string]bool{}
	for _, op := range rec.AppliedOperationIDs {
		applied[op] = true
	}
	for _, r := range g.cache.ActiveRuns() {
		if r.NodeID != node.NodeID || present[r.AttemptID] || !applied[dispatch.OpID(r.AttemptID, "launch")] {
			continue
		}
		if _, err := g.runs.LoseAttempt(ctx, *r, schemas.CodeNodeLost, "node "+node.NodeID+" no longer holds the workload it launched", redelivered); err != nil && !errors.Is(err, lifecycle.ErrNoChange) {
			return err
		}
	}
	return g.facts.RecordFacts(ctx, node.NodeID, node.FencingToken, rec.Facts)
}

// applyReceipt reacts to a node's answer to a command. A command refused for
// a stale session is sent again under the node's current token; one that
// failed ends the Run.
func (g *Ingest) applyReceipt(ctx context.Context, node schemas.NodeRecord, rc schemas.OperationReceipt, redelivered bool) error {
	if rc.PrefetchID != "" && (rc.Kind == schemas.CmdPrepareImage || rc.Kind == schemas.CmdPrepareArtifact) {
		return g.prefetch.Receipt(ctx, node.NodeID, rc)
	}
	if rc.Outcome == schemas.OutcomeApplied || rc.RunID == "" {
		return nil
	}
	g.log.Info("command not applied", zap.String("node_id", node.NodeID), zap.String("op", rc.OperationID),
		zap.String("outcome", rc.Outcome), zap.String("code", string(rc.Code)), zap.String("message", rc.Message))
	if rc.Outcome == schemas.OutcomeRefused && (rc.Code == schemas.CodeStaleFencingToken || rc.Code == schemas.CodeStaleGeneration) {
		return nil // the scheduler resends under the current session
	}
	if rc.Kind == schemas.CmdStopWorkload {
		return nil
	}
	_, err := g.runs.Advance(ctx, rc.RunID, lifecycle.ReceiptFailure{NodeID: node.NodeID, Receipt: rc}, redelivered)
	if errors.Is(err, lifecycle.ErrNotBookedHere) {
		g.refuse(node.NodeID, rc.RunID, rc.AttemptID, string(schemas.ObsReceipt))
		return nil
	}
	if err != nil && !errors.Is(err, lifecycle.ErrNoChange) && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	return nil
}
