package controlplane

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// handleObservation applies one node report. Reports from a superseded
// session, or naming another node than the subject they came on, are
// dropped with a counted, logged reason; malformed ones are terminated.
func (cp *ControlPlane) handleObservation(ctx context.Context, m jetstream.Msg) {
	var o schemas.Observation
	enc := codec.Detect(m.Headers(), m.Data())
	err := codec.Decode(enc, m.Data(), &o)
	if err == nil {
		err = o.Validate()
	}
	if err != nil {
		cp.log.Warn("malformed observation dropped", zap.String("subject", m.Subject()), zap.Error(err))
		_ = m.Term()
		return
	}
	if err := cp.observe(ctx, m.Subject(), o); err != nil {
		cp.log.Warn("observation will retry", zap.String("node_id", o.NodeID), zap.Error(err))
		_ = m.Nak()
		return
	}
	_ = m.Ack()
}

func (cp *ControlPlane) observe(ctx context.Context, subject string, o schemas.Observation) error {
	node, ok := cp.cache.node(o.NodeID)
	switch {
	case subjectNode(subject) != o.NodeID:
		return cp.drop(o, "node_id does not match the subject it was published on")
	case !ok:
		return cp.drop(o, "node is not enrolled")
	case o.FencingToken != node.FencingToken:
		return cp.drop(o, "fencing token is not the node's current session")
	}
	now := cp.now()
	switch o.Kind {
	case schemas.ObsWorkload:
		o.Workload.ReceivedAt = now
		return cp.applyWorkload(ctx, node, *o.Workload)
	case schemas.ObsReceipt:
		return cp.applyReceipt(ctx, node, *o.Receipt)
	case schemas.ObsReconciliation:
		return cp.applyReconciliation(ctx, node, *o.Reconciliation, now)
	case schemas.ObsFacts:
		return cp.applyFacts(ctx, o.NodeID, o.FencingToken, *o.Facts)
	}
	return nil
}

// drop counts and logs a fenced or misaddressed report. It is not an error:
// the message is acked so it is never redelivered.
func (cp *ControlPlane) drop(o schemas.Observation, why string) error {
	cp.metrics.fencedObs.Add(1)
	cp.log.Info("observation dropped", zap.String("node_id", o.NodeID), zap.Uint64("fencing_token", o.FencingToken),
		zap.String("kind", string(o.Kind)), zap.String("reason", why))
	return nil
}

// applyWorkload moves the Run by what its node saw.
func (cp *ControlPlane) applyWorkload(ctx context.Context, node schemas.NodeRecord, w schemas.WorkloadObservation) error {
	orphan, ended := false, false
	_, err := cp.advance(ctx, w.RunID, func(r *schemas.Run, emit func(schemas.RunEvent)) error {
		ended = false
		if r.AttemptID != w.AttemptID || r.NodeID != node.NodeID {
			orphan = w.Phase == schemas.WorkloadRunning || w.Phase == schemas.WorkloadStarting
			return bus.ErrNoChange
		}
		if r.Phase.Terminal() {
			return bus.ErrNoChange
		}
		if w.Progress != nil {
			return noteProgress(r, w, emit)
		}
		to, code, msg := targetPhase(r, w)
		if to == "" || (!to.Terminal() && phaseRank(to) <= phaseRank(r.Phase)) {
			cp.metrics.staleReports.Add(1)
			return bus.ErrNoChange
		}
		from := r.Phase
		r.Phase = to
		if w.StartedAt != nil {
			r.StartedAt = w.StartedAt
		}
		if to.Terminal() {
			r.ExitCode, r.OOMKilled, r.FinishedAt, r.Reason = w.ExitCode, w.OOMKilled, w.FinishedAt, string(code)
			ended = true
		}
		ev := phaseEvent(r, from, code, msg)
		observed := w.ObservedAt
		ev.ObservedAt = &observed
		emit(ev)
		return nil
	})
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		cp.log.Info("report for an unknown run", zap.String("run_id", w.RunID), zap.String("node_id", node.NodeID))
		if w.Phase == schemas.WorkloadRunning || w.Phase == schemas.WorkloadStarting {
			return cp.sendStopAttempt(ctx, node.NodeID, w.RunID, w.AttemptID, 0, "unknown to the control plane")
		}
		return nil
	}
	if errors.Is(err, ErrIllegalTransition) {
		cp.log.Warn("report refused by the run state machine", zap.String("run_id", w.RunID), zap.Error(err))
		return nil
	}
	if orphan {
		// The node runs an attempt the Run has moved on from.
		return cp.sendStopAttempt(ctx, node.NodeID, w.RunID, w.AttemptID, 0, "attempt superseded")
	}
	if err != nil && !errors.Is(err, bus.ErrNoChange) {
		return err
	}
	if err == nil && ended {
		cp.poke() // its place is free: a waiting or queued Run may take it
	}
	return nil
}

// applyReconciliation squares the node's full account with the Runs booked
// on it: what runs there moves its Run; a Run whose launch the node applied
// but whose workload is gone (and whose exit never arrived) lost its
// attempt. Workloads the control plane does not know are stopped by
// applyWorkload.
func (cp *ControlPlane) applyReconciliation(ctx context.Context, node schemas.NodeRecord, rec schemas.Reconciliation, now time.Time) error {
	present := map[string]bool{}
	for _, w := range rec.Workloads {
		w.ReceivedAt = now
		present[w.AttemptID] = true
		if err := cp.applyWorkload(ctx, node, w); err != nil {
			return err
		}
	}
	applied := map[string]bool{}
	for _, op := range rec.AppliedOperationIDs {
		applied[op] = true
	}
	for _, r := range cp.cache.activeRuns() {
		if r.NodeID != node.NodeID || present[r.AttemptID] || !applied[opID(r.AttemptID, "launch")] {
			continue
		}
		if _, err := cp.loseAttempt(ctx, *r, "node "+node.NodeID+" no longer holds the workload it launched"); err != nil && !errors.Is(err, bus.ErrNoChange) {
			return err
		}
	}
	return cp.applyFacts(ctx, node.NodeID, node.FencingToken, rec.Facts)
}

// noteProgress records an image transfer report of the attempt being
// prepared. Reports that arrive after the attempt moved on, or that repeat
// the stored counts, change nothing.
func noteProgress(r *schemas.Run, w schemas.WorkloadObservation, emit func(schemas.RunEvent)) error {
	if r.Phase != schemas.PhasePreparing || (r.Progress != nil && *r.Progress == *w.Progress) {
		return bus.ErrNoChange
	}
	p := *w.Progress
	r.Progress = &p
	observed := w.ObservedAt
	emit(schemas.RunEvent{Type: schemas.EventProgress, Phase: r.Phase, NodeID: r.NodeID, Attempt: r.Attempt,
		Progress: &p, ObservedAt: &observed, Message: "image transfer " + p.String()})
	return nil
}

// targetPhase maps a workload report onto the Run's lifecycle.
func targetPhase(r *schemas.Run, w schemas.WorkloadObservation) (schemas.Phase, schemas.Code, string) {
	switch w.Phase {
	case schemas.WorkloadPreparing:
		return schemas.PhasePreparing, "", "node is preparing the image"
	case schemas.WorkloadPrepared, schemas.WorkloadStarting:
		return schemas.PhaseLaunching, "", "image ready; starting the container"
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
		return schemas.PhaseFailed, schemas.CodeLaunchFailed, w.FailureReason
	}
	return "", "", ""
}

// applyReceipt reacts to a node's answer to a command. A command refused for
// a stale session is sent again under the node's current token; one that
// failed ends the Run.
func (cp *ControlPlane) applyReceipt(ctx context.Context, node schemas.NodeRecord, rc schemas.OperationReceipt) error {
	if rc.Outcome == schemas.OutcomeApplied || rc.RunID == "" {
		return nil
	}
	cp.log.Info("command not applied", zap.String("node_id", node.NodeID), zap.String("op", rc.OperationID),
		zap.String("outcome", rc.Outcome), zap.String("code", string(rc.Code)), zap.String("message", rc.Message))
	if rc.Outcome == schemas.OutcomeRefused && (rc.Code == schemas.CodeStaleFencingToken || rc.Code == schemas.CodeStaleGeneration) {
		return nil // the reconcile loop resends under the current session
	}
	if rc.Kind == schemas.CmdStopWorkload {
		return nil
	}
	_, err := cp.advance(ctx, rc.RunID, func(r *schemas.Run, emit func(schemas.RunEvent)) error {
		if r.AttemptID != rc.AttemptID || r.Phase.Terminal() {
			return bus.ErrNoChange
		}
		from := r.Phase
		r.Phase, r.Reason = schemas.PhaseFailed, string(schemas.CodeLaunchFailed)
		if r.CancelRequested {
			r.Phase, r.Reason = schemas.PhaseCancelled, string(schemas.CodeCancelled)
		}
		emit(phaseEvent(r, from, schemas.Code(r.Reason), string(rc.Kind)+" "+rc.Outcome+": "+string(rc.Code)+": "+rc.Message))
		return nil
	})
	if err != nil && !errors.Is(err, bus.ErrNoChange) && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	return nil
}

// applyFacts stores a node's latest facts on its record.
func (cp *ControlPlane) applyFacts(ctx context.Context, nodeID string, token uint64, f schemas.NodeFacts) error {
	now := cp.now()
	f.Normalize()
	rec, rev, err := bus.UpdateJSON(ctx, cp.nodesKV, nodeID, func(n *schemas.NodeRecord) error {
		if n.FencingToken != token {
			return errFenced
		}
		n.Facts, n.FactsReceivedAt = &f, now
		return nil
	})
	if errors.Is(err, errFenced) {
		cp.metrics.fencedObs.Add(1)
		return nil
	}
	if err != nil {
		return err
	}
	cp.cache.applyNodeRecord(rec, rev)
	return nil
}
