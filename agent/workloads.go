package agent

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Labels the agent puts on every workload, so a restarted agent knows what
// it runs without any state of its own.
const (
	LabelRunID      = "warmfleet.run_id"
	LabelAttemptID  = "warmfleet.attempt_id"
	LabelMaxRuntime = "warmfleet.max_runtime_seconds"
	// LabelGPUs lists the UUIDs of the cards the workload was given,
	// comma-separated, so a restarted agent reports what each one holds.
	LabelGPUs = "warmfleet.gpus"
)

// maxRuntimeStop is the journal operation id for a stop the node decided on
// itself when a workload outlived its max runtime.
func maxRuntimeStop(attemptID string) string { return attemptID + ".max-runtime" }

// report publishes a workload observation stamped with this machine's clock.
func (a *Agent) report(ctx context.Context, w schemas.WorkloadObservation) {
	if w.ObservedAt.IsZero() {
		w.ObservedAt = a.cfg.Now()
	}
	if err := a.publish(ctx, schemas.Observation{Kind: schemas.ObsWorkload, Workload: &w}, ""); err != nil && ctx.Err() == nil {
		a.log.Warn("workload report not published", zap.String("run_id", w.RunID), zap.String("phase", string(w.Phase)), zap.Error(err))
	}
}

// observationOf turns a runtime status into a report.
func observationOf(st noderuntime.WorkloadStatus) schemas.WorkloadObservation {
	w := schemas.WorkloadObservation{RunID: st.Labels[LabelRunID], AttemptID: st.Labels[LabelAttemptID], Phase: schemas.WorkloadUnknown}
	if g := st.Labels[LabelGPUs]; g != "" {
		w.GPUs = strings.Split(g, ",")
	}
	if w.AttemptID == "" {
		w.AttemptID = st.ID
	}
	if !st.StartedAt.IsZero() {
		t := st.StartedAt
		w.StartedAt = &t
	}
	switch st.State {
	case noderuntime.WorkloadCreated:
		w.Phase = schemas.WorkloadStarting
	case noderuntime.WorkloadRunning:
		w.Phase = schemas.WorkloadRunning
	case noderuntime.WorkloadExited:
		w.Phase = schemas.WorkloadExited
		code := st.ExitCode
		w.ExitCode, w.OOMKilled = &code, st.OOMKilled
		if !st.FinishedAt.IsZero() {
			t := st.FinishedAt
			w.FinishedAt = &t
		}
	}
	return w
}

// watch waits for a workload to exit, enforces its max runtime, reports the
// exit and removes the workload once the report is durable. One watcher per
// workload per process.
func (a *Agent) watch(ctx context.Context, id string) {
	a.mu.Lock()
	if _, ok := a.watching[id]; ok {
		a.mu.Unlock()
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	a.watching[id] = cancel
	a.mu.Unlock()

	// The output is shipped from now on, under the agent's context: it
	// outlives this watch when the exit report gives up waiting for it.
	sh, err := a.shipOutput(ctx, id)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		a.log.Warn("workload output cannot be shipped", zap.String("workload", id), zap.Error(err))
	}
	a.wg.Go(func() {
		defer func() {
			a.mu.Lock()
			delete(a.watching, id)
			a.mu.Unlock()
			cancel()
		}()
		st, err := a.rt.Inspect(wctx, id)
		if err != nil {
			a.log.Warn("inspect workload", zap.String("workload", id), zap.Error(err))
			return
		}
		if limit, _ := strconv.ParseInt(st.Labels[LabelMaxRuntime], 10, 64); limit > 0 && st.State != noderuntime.WorkloadExited {
			a.enforceMaxRuntime(wctx, st, time.Duration(limit)*time.Second)
		}
		final, err := a.rt.Wait(wctx, id)
		if err != nil {
			if wctx.Err() == nil {
				a.log.Warn("wait for workload", zap.String("workload", id), zap.Error(err))
			}
			return
		}
		if final.Labels == nil {
			final.Labels = st.Labels
		}
		a.reportExit(wctx, final, sh)
	})
}

// enforceMaxRuntime stops the workload when it outlives limit, measured from
// its own start on this machine's clock.
func (a *Agent) enforceMaxRuntime(ctx context.Context, st noderuntime.WorkloadStatus, limit time.Duration) {
	started := st.StartedAt
	if started.IsZero() {
		started = a.cfg.Now()
	}
	left := limit - a.cfg.Now().Sub(started)
	a.wg.Go(func() {
		t := time.NewTimer(max(left, 0))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.log.Info("max runtime reached; stopping", zap.String("workload", st.ID), zap.Duration("limit", limit))
		reason := string(schemas.CodeMaxRuntime)
		if err := a.journal.Record(JournalEntry{OperationID: maxRuntimeStop(st.ID), Kind: schemas.CmdStopWorkload, RunID: st.Labels[LabelRunID],
			AttemptID: st.ID, Outcome: schemas.OutcomeApplied, StopReason: reason, AppliedAt: a.cfg.Now()}); err != nil {
			a.log.Error("journal max-runtime stop", zap.Error(err))
		}
		if err := a.rt.Stop(ctx, st.ID, a.cfg.StopGrace); err != nil && ctx.Err() == nil {
			a.log.Warn("stop at max runtime", zap.String("workload", st.ID), zap.Error(err))
		}
	})
}

// reportExit stores the workload's output, publishes its end, then removes
// it: so a Run whose phase says it ended already has every line stored.
func (a *Agent) reportExit(ctx context.Context, st noderuntime.WorkloadStatus, sh *shipment) {
	// Finish makes the output whole; until it has, the shipment waits for
	// the writer's own done mark (Remove, below, gives it one at the latest).
	err := a.rt.Finish(ctx, st.ID)
	if err != nil && !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		a.log.Warn("finish workload output", zap.String("workload", st.ID), zap.Error(err))
	}
	if sh != nil {
		if err == nil || errors.Is(err, noderuntime.ErrWorkloadNotFound) {
			sh.finish()
		}
		t := time.NewTimer(a.cfg.LogShipTimeout)
		select {
		case <-sh.done:
		case <-t.C:
			a.log.Warn("reporting the exit before the workload's output is stored; shipping goes on", zap.String("workload", st.ID), zap.Duration("waited", a.cfg.LogShipTimeout))
		case <-ctx.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
	w := observationOf(st)
	if e, ok := a.journal.Stopped(st.ID); ok {
		w.StopReason = e.StopReason
	}
	w.ObservedAt = a.cfg.Now()
	// The exit is the one report that must arrive: retry until JetStream has
	// it (NATS may be restarting). The workload is kept until then, so a
	// restarted agent reports it again from the runtime.
	for wait := 250 * time.Millisecond; ; wait = min(wait*2, 5*time.Second) {
		dedupe := "exit:" + st.ID + ":" + strconv.FormatUint(a.Enrollment().FencingToken, 10)
		err := a.publish(ctx, schemas.Observation{Kind: schemas.ObsWorkload, Workload: &w}, dedupe)
		if err == nil {
			break
		}
		a.log.Warn("exit report not published; retrying", zap.String("workload", st.ID), zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
	a.log.Info("workload exited", zap.String("run_id", w.RunID), zap.String("workload", st.ID), zap.Int("exit_code", st.ExitCode), zap.Bool("oom_killed", st.OOMKilled))
	if err := a.rt.Remove(ctx, st.ID); err != nil && !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		a.log.Warn("remove exited workload", zap.String("workload", st.ID), zap.Error(err))
		return
	}
	a.release(st.ID)
	if sh != nil {
		sh.reportedDone()
	}
}

// reconcile reports everything the runtime holds and resumes watching it:
// after an agent restart the containers kept running, and the control plane
// learns their state from this rather than launching them again.
func (a *Agent) reconcile(ctx context.Context, facts schemas.NodeFacts) error {
	all, err := a.rt.List(ctx)
	if err != nil {
		return err
	}
	// Session runtimes are the session host's, not Runs: reporting them
	// would have the control plane stop them as unknown workloads.
	list := all[:0:0]
	for _, st := range all {
		if !noderuntime.IsSessionWorkload(st) {
			list = append(list, st)
		}
	}
	enr := a.Enrollment()
	rec := schemas.Reconciliation{NodeID: a.cfg.NodeID, Generation: enr.Generation, FencingToken: enr.FencingToken,
		AppliedOperationIDs: a.journal.Applied(), Facts: facts}
	now := a.cfg.Now()
	for _, st := range list {
		w := observationOf(st)
		if e, ok := a.journal.Stopped(st.ID); ok {
			w.StopReason = e.StopReason
		}
		w.ObservedAt = now
		rec.Workloads = append(rec.Workloads, w)
	}
	if err := a.publish(ctx, schemas.Observation{Kind: schemas.ObsReconciliation, Reconciliation: &rec}, ""); err != nil {
		return err
	}
	for _, st := range list {
		a.watch(ctx, st.ID) // an exited one is reported and removed at once
	}
	held := make(map[string]bool, len(all))
	for _, st := range all {
		held[st.ID] = true
		if noderuntime.IsSessionWorkload(st) {
			// A session's output ships while it runs (sessionRuntime).
			if _, err := a.shipOutput(ctx, st.ID); err != nil && !errors.Is(err, os.ErrNotExist) {
				a.log.Warn("session output cannot be shipped", zap.String("workload", st.ID), zap.Error(err))
			}
		}
	}
	a.shipLeftovers(ctx, held)
	return nil
}
