package agent

import (
	"cmp"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/agent/caches"
	"github.com/warmfleet/warmfleet/agent/output"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// applyLaunch starts an attempt's workload. Whatever stops it on the way
// ends in launch.fail.
func (a *Agent) applyLaunch(ctx context.Context, c schemas.Command, rc *schemas.OperationReceipt) {
	l := &launch{a: a, cmd: c.Launch, rc: rc}
	if err := l.run(ctx); err != nil {
		l.fail(ctx, err)
	}
}

// launch is one LaunchWorkload applied: its steps, in order, are run's.
type launch struct {
	a    *Agent
	cmd  *schemas.LaunchWorkload
	rc   *schemas.OperationReceipt
	spec noderuntime.WorkloadSpec
	// prepared: the attempt's prepare ensured its image, which the attempt
	// holds still, so Launch's own check of it suffices.
	prepared bool
	// outputDir is the output directory made for this launch; it goes
	// again when the workload never started.
	outputDir string
}

// launchError is why a launch did not start its workload.
type launchError struct {
	outcome string // schemas.OutcomeRefused or schemas.OutcomeFailed
	code    schemas.Code
	err     error // the receipt's message
	// reason is the failed report's, when it is not the message.
	reason     string
	stopReason string
}

func (e *launchError) Error() string { return e.err.Error() }
func (e *launchError) Unwrap() error { return e.err }

func refusal(code schemas.Code, err error) *launchError {
	return &launchError{outcome: schemas.OutcomeRefused, code: code, err: err}
}

func failure(code schemas.Code, err error) *launchError {
	return &launchError{outcome: schemas.OutcomeFailed, code: code, err: err}
}

// run takes the launch's steps; an error is why it stopped.
func (l *launch) run(ctx context.Context) error {
	if err := l.admissible(); err != nil {
		return err
	}
	l.buildSpec()
	// From its caches' mount to its start the launch holds off disk
	// sweeps, and what it uses is held for the attempt until its workload
	// is removed: no sweep takes either from under it.
	defer l.a.disk.Use()()
	l.prepared = l.a.attempts.launching(l.cmd.AttemptID, l.cmd.ManifestDigest, l.cmd.Caches, l.cmd.GPUs)
	if err := l.mount(ctx); err != nil {
		return err
	}
	// A launch does not depend on its prepare having been applied first:
	// commands of one attempt can be redelivered out of order (a
	// superseded process hands one back), so without a prepare here the
	// image is ensured.
	if !l.prepared {
		if err := l.ensureImage(ctx); err != nil {
			return err
		}
	}
	dir, err := output.PrepareRun(l.a.cfg.DataDir, l.cmd.TenantOf(), l.cmd.RunID, l.cmd.AttemptID)
	if err != nil {
		return failure(schemas.CodeLaunchFailed, err)
	}
	l.outputDir = dir
	l.spec.Output = noderuntime.Output{Dir: dir, BytesPerSecond: max(l.a.cfg.LogRate, 0), Burst: l.a.cfg.LogBurst}
	return l.start(ctx)
}

// admissible refuses a launch this node must not start: its attempt was
// stopped first, its preparation already failed for a reason a retry here
// would meet again (wrong bytes, a refused credential), or it asks for a
// network this node does not give (placement does not book such a Run
// here; this is the defence against a booking made on older facts).
func (l *launch) admissible() error {
	if stop, ok := l.a.journal.Stopped(l.cmd.AttemptID); ok {
		e := refusal(schemas.CodeCancelled, errors.New("attempt was stopped before launch: "+stop.StopReason))
		e.reason, e.stopReason = "stopped before launch", stop.StopReason
		return e
	}
	if f, ok := l.a.attempts.prepareFailed(l.cmd.AttemptID); ok {
		return failure(f.code, errors.New("preparation failed: "+f.msg))
	}
	if !offersNetwork(l.a.cfg.NetworkModes, l.cmd.Network) {
		return refusal(schemas.CodeNetworkUnavailable, errors.New("network "+schemas.NetworkModeOf(l.cmd.Network)+" is not offered on this node"))
	}
	return nil
}

// buildSpec fills the workload's spec from the command: its image,
// command, environment, resources, devices, container settings, and the
// labels a restarted agent reads back.
func (l *launch) buildSpec() {
	c := l.cmd
	// The workload learns who it is from the environment, after the
	// request's own variables so they cannot be spoofed by it.
	env := make([]string, 0, len(c.Env)+4)
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	env = append(env, "WARMFLEET_RUN_ID="+c.RunID, "WARMFLEET_ATTEMPT_ID="+c.AttemptID, "WARMFLEET_NODE_ID="+l.a.cfg.NodeID)
	l.spec = noderuntime.WorkloadSpec{
		ID: c.AttemptID, ImageReference: c.Reference, ManifestDigest: c.ManifestDigest, Platform: c.Platform, Command: c.Command,
		CPUMillis: c.Resources.CPUMillis, MemoryBytes: c.Resources.MemoryBytes, Devices: c.Devices,
		Labels: map[string]string{
			LabelRunID: c.RunID, LabelAttemptID: c.AttemptID,
			LabelMaxRuntime: strconv.FormatInt(c.MaxRuntimeSeconds, 10),
		},
	}
	if len(c.GPUs) > 0 {
		// The cards' UUIDs, as placement booked them: inside the
		// container CUDA numbers its cards from 0 whatever they are.
		env = append(env, "WARMFLEET_GPUS="+strings.Join(c.GPUs, ","))
		l.spec.Labels[LabelGPUs] = strings.Join(c.GPUs, ",")
	}
	l.spec.Env = env
	if len(c.Caches) > 0 {
		ids := make([]string, len(c.Caches))
		for i, cm := range c.Caches {
			ids[i] = schemas.CacheItemID(cm.Name, cm.CompatibilityKey)
		}
		l.spec.Labels[LabelCaches] = strings.Join(ids, ",")
	}
	if len(c.Artifacts) > 0 {
		digests := make([]string, len(c.Artifacts))
		for i, m := range c.Artifacts {
			digests[i] = m.Digest
		}
		l.spec.Labels[LabelArtifacts] = strings.Join(digests, ",")
	}
	withContainer(&l.spec, c)
}

// mount makes the launch's bind mounts: each cache, created on first use
// and marked used now, and each artifact replica, checked here (its seal,
// else a re-hash) so one changed on disk since its prepare is fetched
// again, never mounted.
func (l *launch) mount(ctx context.Context) error {
	mounts, err := l.a.caches.Mounts(l.cmd.Caches)
	switch {
	case errors.Is(err, caches.ErrInvalid):
		return refusal(schemas.CodeInvalidCache, err)
	case err != nil:
		return failure(schemas.CodeLaunchFailed, err)
	}
	for _, m := range l.cmd.Artifacts {
		res, err := l.a.replicas.ensure(ctx, m, l.cmd.RunID, "", nil)
		if err != nil {
			return failure(artifactFailureCode(err), err)
		}
		l.a.attempts.holdArtifact(l.cmd.AttemptID, m.Digest)
		mounts = append(mounts, noderuntime.Mount{Source: res.Path, Target: m.Path, ReadOnly: true})
	}
	l.spec.Mounts = mounts
	return nil
}

func (l *launch) ensureImage(ctx context.Context) error {
	c := l.cmd
	_, err := l.a.ensureImage(ctx, noderuntime.ImageSpec{Reference: c.Reference, ManifestDigest: c.ManifestDigest, Platform: c.Platform,
		Unpack: true, Credentials: l.a.creds.Registry(c.Reference, c.RunID)})
	if err != nil {
		return failure(failureCode(err), err)
	}
	return nil
}

// start launches the workload and watches it. An image removed since its
// prepare (the hold kept sweeps off it, but not an operator) is ensured
// then, and the launch tried once more. A workload that exists already
// was launched by an earlier delivery whose journal write was lost.
func (l *launch) start(ctx context.Context) error {
	c := l.cmd
	if !l.prepared {
		// A prepared attempt's report already moved the Run to launching;
		// saying so again would only put a publish and the control
		// plane's handling of it on the launch's path.
		l.a.rep.workload(ctx, schemas.WorkloadObservation{RunID: c.RunID, AttemptID: c.AttemptID, Phase: schemas.WorkloadStarting})
	}
	st, err := l.a.rt.Launch(ctx, l.spec)
	if l.prepared && errors.Is(err, noderuntime.ErrImageNotFound) {
		l.a.log.Warn("image gone since its prepare; ensuring it again", zap.String("workload", c.AttemptID), zap.String("digest", c.ManifestDigest))
		if err := l.ensureImage(ctx); err != nil {
			return err
		}
		st, err = l.a.rt.Launch(ctx, l.spec)
	}
	switch {
	case errors.Is(err, noderuntime.ErrWorkloadExists):
		l.rc.Duplicate, l.rc.Outcome = true, schemas.OutcomeApplied
	case err != nil:
		return failure(schemas.CodeLaunchFailed, err)
	default:
		l.rc.Outcome = schemas.OutcomeApplied
		l.a.log.Info("workload started", zap.String("run_id", c.RunID), zap.String("workload", c.AttemptID))
		l.a.rep.workload(ctx, observationOf(st))
	}
	l.a.workloads.watch(ctx, c.AttemptID)
	return nil
}

// fail is the one way a launch ends without its workload: the receipt
// says why, the attempt lets go of what it held, an output directory made
// for it goes (nothing ran, nothing was written), and the workload is
// reported failed. A code more precise than launch_failed travels in the
// report too.
func (l *launch) fail(ctx context.Context, err error) {
	var le *launchError
	if !errors.As(err, &le) {
		le = failure(schemas.CodeLaunchFailed, err)
	}
	l.rc.Outcome, l.rc.Code, l.rc.Message = le.outcome, le.code, le.Error()
	l.a.attempts.release(l.cmd.AttemptID)
	if l.outputDir != "" {
		_ = os.RemoveAll(l.outputDir)
	}
	w := schemas.WorkloadObservation{RunID: l.cmd.RunID, AttemptID: l.cmd.AttemptID, Phase: schemas.WorkloadFailed,
		FailureReason: cmp.Or(le.reason, l.rc.Message), StopReason: le.stopReason}
	if le.code != schemas.CodeLaunchFailed {
		w.FailureCode = le.code
	}
	l.a.rep.workload(ctx, w)
}
