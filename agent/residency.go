package agent

import (
	"context"
	"errors"
	"os"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// serveSessions runs the configured SessionHost until ctx ends.
func (a *Agent) serveSessions(ctx context.Context) {
	h := a.cfg.Sessions
	if h == nil {
		return
	}
	env := noderuntime.SessionHostEnv{NodeID: a.cfg.NodeID, Conn: a.conn, Runtime: sessionRuntime{Runtime: a.rt, a: a, ctx: ctx}, Log: a.log,
		FencingToken: func() uint64 { return a.Enrollment().FencingToken }}
	if err := h.Serve(ctx, env); err != nil && !errors.Is(err, context.Canceled) {
		a.log.Error("session host stopped", zap.Error(err))
	}
}

// sessionRuntime is the runtime the session host gets: a session's
// workload keeps its output in an output directory of the agent's, shipped
// to its session's log subject while it runs and, once removed, to its end.
type sessionRuntime struct {
	noderuntime.Runtime
	a   *Agent
	ctx context.Context // the agent's: shipping outlives the host's calls
}

// EnsureImage holds the disk for reading, as a Run's prepare does, so a
// disk sweep waits for it.
func (r sessionRuntime) EnsureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	r.a.diskMu.RLock()
	defer r.a.diskMu.RUnlock()
	return r.Runtime.EnsureImage(ctx, spec)
}

func (r sessionRuntime) Launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	r.a.diskMu.RLock()
	defer r.a.diskMu.RUnlock()
	tenant, session := spec.Labels[noderuntime.LabelResidencyTenant], spec.Labels[noderuntime.LabelResidencySession]
	if tenant == "" || session == "" || spec.Output.Dir != "" {
		return r.Runtime.Launch(ctx, spec)
	}
	dir, err := prepareOutput(r.a.cfg.DataDir, outputMeta{AttemptID: spec.ID, Subject: bus.SessionLogs(tenant, session)})
	if err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	spec.Output = noderuntime.Output{Dir: dir, BytesPerSecond: max(r.a.cfg.LogRate, 0), Burst: r.a.cfg.LogBurst}
	st, err := r.Runtime.Launch(ctx, spec)
	switch {
	case errors.Is(err, noderuntime.ErrWorkloadExists):
	case err != nil:
		_ = os.RemoveAll(dir)
		return st, err
	}
	if _, serr := r.a.shipOutput(r.ctx, spec.ID); serr != nil {
		r.a.log.Warn("session output cannot be shipped", zap.String("workload", spec.ID), zap.Error(serr))
	}
	return st, err
}

// Remove removes the workload, then lets its output's shipment finish and
// remove the directory once everything is stored.
func (r sessionRuntime) Remove(ctx context.Context, id string) error {
	err := r.Runtime.Remove(ctx, id)
	if err != nil && !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		return err
	}
	if sh, serr := r.a.shipOutput(r.ctx, id); serr == nil {
		sh.finish()
		sh.reportedDone()
	}
	return err
}
