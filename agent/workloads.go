package agent

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/agent/disk"
	"github.com/warmfleet/warmfleet/agent/output"
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
	// LabelCaches lists the caches a workload mounts and LabelArtifacts
	// the artifact digests (comma-separated), so disk collection keeps
	// them while the workload exists, across agent restarts too.
	LabelCaches    = disk.LabelCaches
	LabelArtifacts = disk.LabelArtifacts
)

// maxRuntimeStop is the journal operation id for a stop the node decided on
// itself when a workload outlived its max runtime.
func maxRuntimeStop(attemptID string) string { return attemptID + ".max-runtime" }

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

// workloads watches the workloads this node runs: from a launch (or, after
// a restart, from reconcile) until each has exited, its output is stored,
// its exit reported and it is removed. It stops one that outlives its max
// runtime.
type workloads struct {
	rt       noderuntime.Runtime
	journal  *Journal
	output   *output.Shipper
	attempts *attempts
	rep      *reporter
	now      func() time.Time
	// stopGrace is given to a workload stopped at its max runtime;
	// shipTimeout bounds how long an exit report waits for the output.
	stopGrace, shipTimeout time.Duration
	log                    *zap.Logger
	wg                     *sync.WaitGroup // the agent's

	mu       sync.Mutex
	watching map[string]context.CancelFunc // by workload id
}

// running counts the workloads this process waits on.
func (w *workloads) running() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.watching)
}

// watch waits for a workload to exit, enforces its max runtime, reports the
// exit and removes the workload once the report is durable. One watcher per
// workload per process.
func (w *workloads) watch(ctx context.Context, id string) {
	w.mu.Lock()
	if _, ok := w.watching[id]; ok {
		w.mu.Unlock()
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	w.watching[id] = cancel
	w.mu.Unlock()

	// The output is shipped from now on, under the agent's context: it
	// outlives this watch when the exit report gives up waiting for it.
	sh, err := w.output.Ship(ctx, id)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		w.log.Warn("workload output cannot be shipped", zap.String("workload", id), zap.Error(err))
	}
	w.wg.Go(func() {
		defer func() {
			w.mu.Lock()
			delete(w.watching, id)
			w.mu.Unlock()
			cancel()
		}()
		st, err := w.rt.Inspect(wctx, id)
		if err != nil {
			w.log.Warn("inspect workload", zap.String("workload", id), zap.Error(err))
			return
		}
		if limit, _ := strconv.ParseInt(st.Labels[LabelMaxRuntime], 10, 64); limit > 0 && st.State != noderuntime.WorkloadExited {
			w.enforceMaxRuntime(wctx, st, time.Duration(limit)*time.Second)
		}
		final, err := w.rt.Wait(wctx, id)
		if err != nil {
			if wctx.Err() == nil {
				w.log.Warn("wait for workload", zap.String("workload", id), zap.Error(err))
			}
			return
		}
		if final.Labels == nil {
			final.Labels = st.Labels
		}
		w.reportExit(wctx, final, sh)
	})
}

// enforceMaxRuntime stops the workload when it outlives limit, measured from
// its own start on this machine's clock.
func (w *workloads) enforceMaxRuntime(ctx context.Context, st noderuntime.WorkloadStatus, limit time.Duration) {
	started := st.StartedAt
	if started.IsZero() {
		started = w.now()
	}
	left := limit - w.now().Sub(started)
	w.wg.Go(func() {
		t := time.NewTimer(max(left, 0))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.log.Info("max runtime reached; stopping", zap.String("workload", st.ID), zap.Duration("limit", limit))
		reason := string(schemas.CodeMaxRuntime)
		if err := w.journal.Record(JournalEntry{OperationID: maxRuntimeStop(st.ID), Kind: schemas.CmdStopWorkload, RunID: st.Labels[LabelRunID],
			AttemptID: st.ID, Outcome: schemas.OutcomeApplied, StopReason: reason, AppliedAt: w.now()}); err != nil {
			w.log.Error("journal max-runtime stop", zap.Error(err))
		}
		if err := w.rt.Stop(ctx, st.ID, w.stopGrace); err != nil && ctx.Err() == nil {
			w.log.Warn("stop at max runtime", zap.String("workload", st.ID), zap.Error(err))
		}
	})
}

// reportExit stores the workload's output, publishes its end, then removes
// it: so a Run whose phase says it ended already has every line stored.
func (w *workloads) reportExit(ctx context.Context, st noderuntime.WorkloadStatus, sh *output.Shipment) {
	// Finish makes the output whole; until it has, the shipment waits for
	// the writer's own done mark (Remove, below, gives it one at the latest).
	err := w.rt.Finish(ctx, st.ID)
	if err != nil && !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		w.log.Warn("finish workload output", zap.String("workload", st.ID), zap.Error(err))
	}
	if sh != nil {
		if err == nil || errors.Is(err, noderuntime.ErrWorkloadNotFound) {
			sh.Finish()
		}
		t := time.NewTimer(w.shipTimeout)
		select {
		case <-sh.Done():
		case <-t.C:
			w.log.Warn("reporting the exit before the workload's output is stored; shipping goes on", zap.String("workload", st.ID), zap.Duration("waited", w.shipTimeout))
		case <-ctx.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
	o := observationOf(st)
	if e, ok := w.journal.Stopped(st.ID); ok {
		o.StopReason = e.StopReason
	}
	o.ObservedAt = w.now()
	// The exit is the one report that must arrive: retry until JetStream has
	// it (NATS may be restarting). The workload is kept until then, so a
	// restarted agent reports it again from the runtime.
	for wait := 250 * time.Millisecond; ; wait = min(wait*2, 5*time.Second) {
		dedupe := "exit:" + st.ID + ":" + strconv.FormatUint(w.rep.session().FencingToken, 10)
		err := w.rep.publish(ctx, schemas.Observation{Kind: schemas.ObsWorkload, Workload: &o}, dedupe)
		if err == nil {
			break
		}
		w.log.Warn("exit report not published; retrying", zap.String("workload", st.ID), zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
	w.log.Info("workload exited", zap.String("run_id", o.RunID), zap.String("workload", st.ID), zap.Int("exit_code", st.ExitCode), zap.Bool("oom_killed", st.OOMKilled))
	if err := w.rt.Remove(ctx, st.ID); err != nil && !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		w.log.Warn("remove exited workload", zap.String("workload", st.ID), zap.Error(err))
		return
	}
	w.attempts.release(st.ID)
	if sh != nil {
		sh.ReportedDone()
	}
}

// reconcile reports everything the runtime holds and resumes watching it:
// after an agent restart the containers kept running, and the control plane
// learns their state from this rather than launching them again.
func (w *workloads) reconcile(ctx context.Context, facts schemas.NodeFacts) error {
	all, err := w.rt.List(ctx)
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
	enr := w.rep.session()
	rec := schemas.Reconciliation{NodeID: w.rep.nodeID, Generation: enr.Generation, FencingToken: enr.FencingToken,
		AppliedOperationIDs: w.journal.Applied(), Facts: facts}
	now := w.now()
	for _, st := range list {
		o := observationOf(st)
		if e, ok := w.journal.Stopped(st.ID); ok {
			o.StopReason = e.StopReason
		}
		o.ObservedAt = now
		rec.Workloads = append(rec.Workloads, o)
	}
	if err := w.rep.publish(ctx, schemas.Observation{Kind: schemas.ObsReconciliation, Reconciliation: &rec}, ""); err != nil {
		return err
	}
	for _, st := range list {
		w.watch(ctx, st.ID) // an exited one is reported and removed at once
	}
	held := make(map[string]bool, len(all))
	for _, st := range all {
		held[st.ID] = true
		if noderuntime.IsSessionWorkload(st) {
			// A session's output ships while it runs (sessionRuntime).
			if _, err := w.output.Ship(ctx, st.ID); err != nil && !errors.Is(err, os.ErrNotExist) {
				w.log.Warn("session output cannot be shipped", zap.String("workload", st.ID), zap.Error(err))
			}
		}
	}
	w.output.ShipLeftovers(ctx, held)
	return nil
}
