package lane

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
	"github.com/warmfleet/warmfleet/controlplane/connhealth"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/schemas"
)

// Run drives the lane's executions until ctx ends, checking its
// connections at start and a failed one again each VerifyInterval.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	m.verify(ctx, connhealth.Every)
	checked := time.Now()
	for {
		if time.Since(checked) >= m.cfg.VerifyInterval {
			m.verify(ctx, connhealth.NotVerified)
			checked = time.Now()
		}
		for _, r := range m.cache.ActiveRuns() {
			if ctx.Err() != nil {
				return
			}
			if !m.Owns(*r) {
				continue
			}
			if err := m.drive(ctx, *r); err != nil && !errors.Is(err, lifecycle.ErrNoChange) {
				m.log.Warn("lane", zap.String("run_id", r.ID), zap.String("phase", string(r.Phase)), zap.Error(err))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// drive moves one lane-booked Run on: its launch found or made, the
// steps the scheduler owes a node's Run (its start deadline, a stop past
// its max runtime), a cancel or stop carried out, and what the provider
// says of its execution reported.
func (m *Manager) drive(ctx context.Context, r schemas.Run) error {
	k, ok := m.connection(r)
	if !ok {
		return m.lose(ctx, r, "its lane connection is not configured here")
	}
	if r.Execution.ExecutionID == "" {
		return m.reconcile(ctx, r, k)
	}
	ref := m.ref(r, k)
	switch lifecycle.Due(r, 0, m.now(), m.cfg.Timing) {
	case lifecycle.StepDeadline:
		// Not started by its start deadline: the Run is left stopping, and
		// its execution is released below.
		run, err := m.runs.Advance(ctx, r.ID, lifecycle.DeadlineExceeded{}, false)
		if err != nil {
			return err
		}
		r = run
	case lifecycle.StepStopOverdue:
		// Past its max runtime, and the provider's execution timeout has
		// not ended it: released, and ended as a timeout would end it.
		if _, err := k.Executor.Release(ctx, ref); err != nil && !errors.Is(err, capacity.ErrNotFound) {
			return err
		}
		return m.report(ctx, r, ephemeral.Execution{State: ephemeral.StateTimedOut})
	}
	if r.CancelRequested || r.Stopping != "" {
		if _, err := k.Executor.Release(ctx, ref); err != nil && !errors.Is(err, capacity.ErrNotFound) {
			return err
		}
	}
	x, err := k.Executor.Observe(ctx, ref)
	if errors.Is(err, capacity.ErrNotFound) {
		return m.lose(ctx, r, "the provider no longer knows execution "+ref.ExecutionID)
	}
	if err != nil {
		return err
	}
	return m.report(ctx, r, x)
}

func (m *Manager) ref(r schemas.Run, k Connection) ephemeral.Ref {
	return ephemeral.Ref{ConnectionID: k.ID, ExecutionID: r.Execution.ExecutionID, OfferID: r.Execution.OfferID, OwnershipToken: k.OwnershipToken}
}

// launch sends r's booked attempt to its executor, its attempt id the
// launch key, and records the execution's id. An answer that is lost is
// left to reconcile.
func (m *Manager) launch(ctx context.Context, r schemas.Run, k Connection) error {
	timeout := r.Request.MaxRuntimeSeconds
	req := ephemeral.LaunchRequest{ConnectionID: k.ID, LaunchKey: r.AttemptID, RunID: r.ID, Attempt: r.Attempt, OwnershipToken: k.OwnershipToken,
		OfferID: r.Execution.OfferID, Input: ephemeral.Input{Command: r.Request.Command, Args: r.Request.Args, Env: r.Request.Env},
		ExecutionTimeoutSeconds: timeout, TTLSeconds: timeout + int64(m.cfg.TTL/time.Second)}
	rc, err := k.Executor.Launch(ctx, req)
	switch {
	case capacity.Ambiguous(err):
		m.log.Warn("lane launch answer lost; reconciling", zap.String("run_id", r.ID), zap.String("launch_key", req.LaunchKey), zap.Error(err))
		return nil
	case err != nil:
		_, ferr := m.runs.Advance(ctx, r.ID, lifecycle.Report{NodeID: r.NodeID, Workload: schemas.WorkloadObservation{AttemptID: r.AttemptID,
			Phase: schemas.WorkloadFailed, FailureCode: schemas.CodeLaunchFailed, FailureReason: "the lane refused the launch: " + err.Error(), ObservedAt: m.now()}}, false)
		return ferr
	}
	_, err = m.runs.Advance(ctx, r.ID, lifecycle.LaneLaunched{AttemptID: r.AttemptID, ExecutionID: rc.ExecutionID}, false)
	return err
}

// reconcile finds the execution of a launch whose answer never came:
// listed by its launch key where the executor lists what it owns (then
// recorded, or launched again under the same key when it is not there);
// where it cannot list, the attempt is lost and the provider's TTL ends
// whatever it may have queued.
func (m *Manager) reconcile(ctx context.Context, r schemas.Run, k Connection) error {
	if m.now().Sub(r.PhaseSince) < m.cfg.LostAnswerAfter {
		return nil // the launch may be under way
	}
	if !k.Executor.Support().ListOwned {
		return m.lose(ctx, r, "the lane's launch answer was lost and the provider lists no executions; its TTL reclaims what it queued")
	}
	owned, err := k.Executor.ListOwned(ctx, capacity.OwnershipQuery{ConnectionID: k.ID, OwnershipToken: k.OwnershipToken})
	if err != nil {
		return err
	}
	for _, o := range owned {
		if o.LaunchKey == r.AttemptID && o.OwnershipToken == k.OwnershipToken {
			m.log.Info("lane execution found by its launch key", zap.String("run_id", r.ID), zap.String("execution", o.ExecutionID))
			_, err := m.runs.Advance(ctx, r.ID, lifecycle.LaneLaunched{AttemptID: r.AttemptID, ExecutionID: o.ExecutionID}, false)
			return err
		}
	}
	return m.launch(ctx, r, k)
}

// lose ends r's attempt as its node's loss would: retried under its
// policy.
func (m *Manager) lose(ctx context.Context, r schemas.Run, why string) error {
	_, err := m.runs.LoseAttempt(ctx, r, schemas.CodeNodeLost, why, false)
	return err
}

// report tells r what its execution did, as a node's reports would: it
// runs; then it exited (its output stored first), failed, timed out or
// was cancelled.
func (m *Manager) report(ctx context.Context, r schemas.Run, x ephemeral.Execution) error {
	now := m.now()
	w := schemas.WorkloadObservation{AttemptID: r.AttemptID, ObservedAt: now}
	switch x.State {
	case ephemeral.StateQueued, ephemeral.StateUnknown:
		return nil
	case ephemeral.StateRunning:
		if r.Phase == schemas.PhaseRunning {
			return nil
		}
		started := now.Add(-time.Duration(x.RunSeconds * float64(time.Second)))
		w.Phase, w.StartedAt = schemas.WorkloadRunning, &started
		_, err := m.runs.Advance(ctx, r.ID, lifecycle.Report{NodeID: r.NodeID, Workload: w}, false)
		return err
	}
	if r.Phase != schemas.PhaseRunning && x.State != ephemeral.StateCancelled {
		if err := m.report(ctx, r, ephemeral.Execution{State: ephemeral.StateRunning, RunSeconds: x.RunSeconds}); err != nil && !errors.Is(err, lifecycle.ErrNoChange) {
			return err
		}
	}
	if err := m.store(ctx, r, x); err != nil {
		return err
	}
	code := 0
	w.Phase, w.FinishedAt, w.ExitCode = schemas.WorkloadExited, &now, &code
	switch x.State {
	case ephemeral.StateFailed:
		code = 1
	case ephemeral.StateTimedOut:
		code, w.StopReason = 1, string(schemas.CodeMaxRuntime)
	case ephemeral.StateCancelled:
		switch {
		case r.Stopping != "":
			// Stopped by the control plane, as a node's SIGTERM would: the
			// Run's stop decides how it ends.
			code, w.StopReason = 143, string(r.Stopping)
		case !r.CancelRequested:
			w.Phase, w.ExitCode, w.FinishedAt = schemas.WorkloadFailed, nil, nil
			w.FailureCode, w.FailureReason = schemas.CodeLaunchFailed, "the provider cancelled the execution"
		}
	}
	_, err := m.runs.Advance(ctx, r.ID, lifecycle.Report{NodeID: r.NodeID, Workload: w}, false)
	return err
}
