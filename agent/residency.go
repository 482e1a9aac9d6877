package agent

import (
	"context"
	"errors"
	"os"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/agent/disk"
	"github.com/warmfleet/warmfleet/agent/output"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// serveSessions runs the configured SessionHost until ctx ends.
func (a *Agent) serveSessions(ctx context.Context) {
	h := a.cfg.Sessions
	if h == nil {
		return
	}
	rt := sessionRuntime{Runtime: a.rt, disk: a.disk, output: a.output, dataDir: a.cfg.DataDir,
		logRate: max(a.cfg.LogRate, 0), logBurst: a.cfg.LogBurst, ctx: ctx, log: a.log}
	env := noderuntime.SessionHostEnv{NodeID: a.cfg.NodeID, Conn: a.conn, Runtime: rt, Log: a.log, FencingToken: a.fencingToken}
	if err := h.Serve(ctx, env); err != nil && !errors.Is(err, context.Canceled) {
		a.log.Error("session host stopped", zap.Error(err))
	}
}

// sessionRuntime is the runtime the session host gets: a session's
// workload keeps its output in an output directory of the agent's, shipped
// to its session's log subject while it runs and, once removed, to its end.
type sessionRuntime struct {
	noderuntime.Runtime
	disk              *disk.Collector
	output            *output.Shipper
	dataDir           string
	logRate, logBurst int64
	ctx               context.Context // the agent's: shipping outlives the host's calls
	log               *zap.Logger
}

// EnsureImage holds off disk sweeps, as a Run's prepare does.
func (r sessionRuntime) EnsureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	defer r.disk.Use()()
	return r.Runtime.EnsureImage(ctx, spec)
}

func (r sessionRuntime) Launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	defer r.disk.Use()()
	tenant, session := spec.Labels[noderuntime.LabelResidencyTenant], spec.Labels[noderuntime.LabelResidencySession]
	if tenant == "" || session == "" || spec.Output.Dir != "" {
		return r.Runtime.Launch(ctx, spec)
	}
	dir, err := output.PrepareSession(r.dataDir, spec.ID, tenant, session)
	if err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	spec.Output = noderuntime.Output{Dir: dir, BytesPerSecond: r.logRate, Burst: r.logBurst}
	st, err := r.Runtime.Launch(ctx, spec)
	switch {
	case errors.Is(err, noderuntime.ErrWorkloadExists):
	case err != nil:
		_ = os.RemoveAll(dir)
		return st, err
	}
	if _, serr := r.output.Ship(r.ctx, spec.ID); serr != nil {
		r.log.Warn("session output cannot be shipped", zap.String("workload", spec.ID), zap.Error(serr))
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
	if sh, serr := r.output.Ship(r.ctx, id); serr == nil {
		sh.Finish()
		sh.ReportedDone()
	}
	return err
}
