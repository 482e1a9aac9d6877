package containerd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/oci"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// cleanupTimeout bounds the undo of a failed Launch, which runs even when
// the caller's context has ended.
const cleanupTimeout = 30 * time.Second

// launch is Runtime.Launch: it takes the launch's steps under the id's
// lock and, when one fails, undoes what the steps before it created.
func (w *workloads) launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	if err := checkLaunchSpec(spec); err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	unlock := w.locks.Lock(spec.ID)
	defer unlock()
	l := &launching{w: w, spec: spec, steps: newLaunchSteps()}
	defer func() { w.log.Debug("launch steps", zap.String("workload", spec.ID), l.steps.fields()) }()
	st, err := l.run(ctx)
	if err != nil {
		l.undo(ctx)
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	w.log.Info("launched workload", zap.String("workload", spec.ID), zap.Uint32("pid", l.task.Pid()), zap.Strings("devices", spec.Devices))
	return st, nil
}

// checkLaunchSpec refuses a spec no launch could take, before any lock.
func checkLaunchSpec(spec noderuntime.WorkloadSpec) error {
	if spec.ID == "" {
		return errors.New("launch: empty workload id")
	}
	for k := range spec.Labels {
		if strings.HasPrefix(k, labelPrefix) {
			return fmt.Errorf("launch %s: label %q uses the reserved prefix %q", spec.ID, k, labelPrefix)
		}
	}
	return nil
}

// launching is one launch in progress: its steps in order, and what they
// have created so far, which undo removes when a later step fails.
type launching struct {
	w     *workloads
	spec  noderuntime.WorkloadSpec
	steps *launchSteps

	img    ctrd.Image
	labels map[string]string
	// attached is the workload's network once attached; its setup may
	// still be running until attached.wait returns.
	attached *attachment
	// straySnapshot is set when container creation failed after making
	// the container's snapshot, which then belongs to no container.
	straySnapshot bool
	// secretsWritten: the workload's secret files' tmpfs may exist.
	secretsWritten bool
	container      ctrd.Container
	task           ctrd.Task
}

// run takes the launch's steps in order and stops at the first that
// fails. Everything that can be refused cheaply is refused before
// anything is created. The network's setup goes on while the container
// and task are created: only the process's start needs its interfaces.
func (l *launching) run(ctx context.Context) (noderuntime.WorkloadStatus, error) {
	if err := l.refuseExisting(ctx); err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	l.steps.mark("lookup")
	opts, err := l.checkedOpts()
	if err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	l.steps.mark("checks")
	if l.img, err = l.w.images.forLaunch(ctx, l.spec); err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	l.steps.mark("image")
	if l.attached, err = l.w.net.attach(ctx, l.spec.ID, l.spec.Network); err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	l.steps.mark("network_ns")
	l.secretsWritten = len(l.spec.SecretFiles) > 0 // undo releases even a half-made tmpfs
	secretOpts, err := l.w.secrets.write(l.spec)
	if err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	if secretOpts != nil {
		opts = append(opts, secretOpts)
	}
	l.steps.mark("secrets")
	if err := l.createContainer(ctx, opts); err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	l.steps.mark("container")
	if err := l.w.output.clear(l.spec); err != nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("clear old output: %w", err)
	}
	l.steps.mark("output")
	if l.task, err = l.container.NewTask(ctx, l.w.output.io(l.spec)); err != nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("create task: %w", err)
	}
	l.steps.mark("task")
	if err := l.attached.wait(); err != nil { // the process starts with its interfaces up
		return noderuntime.WorkloadStatus{}, err
	}
	l.steps.mark("network")
	if err := l.task.Start(ctx); err != nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("start task: %w", err)
	}
	l.steps.mark("start")
	started := l.recordStart(ctx)
	l.steps.mark("label")
	l.w.images.markUsed(ctx, l.img.Target().Digest)
	l.steps.mark("mark_used")
	return noderuntime.WorkloadStatus{
		ID:             l.spec.ID,
		State:          noderuntime.WorkloadRunning,
		Labels:         userLabels(l.labels),
		StartedAt:      started,
		Devices:        labelledDevices(l.labels),
		ManifestDigest: l.labels[labelImageDigest],
	}, nil
}

// refuseExisting fails with ErrWorkloadExists when the id is taken.
func (l *launching) refuseExisting(ctx context.Context) error {
	exists, err := l.w.exists(ctx, l.spec.ID)
	if exists {
		return noderuntime.ErrWorkloadExists
	}
	return err
}

// checkedOpts are the spec options of the workload's mounts, limits and
// devices, each checked before anything is created.
func (l *launching) checkedOpts() ([]oci.SpecOpts, error) {
	mounts, err := bindMounts(l.spec.Mounts)
	if err != nil {
		return nil, err
	}
	limits, err := l.w.limits.opts(l.spec)
	if err != nil {
		return nil, err
	}
	if err := l.w.devices.check(l.spec.Devices); err != nil {
		return nil, err
	}
	return append([]oci.SpecOpts{mounts}, limits...), nil
}

// createContainer creates the container on a new snapshot of the image,
// its spec from the image's config, then the workload's command and env,
// checked options, network and devices, and last its confinement.
func (l *launching) createContainer(ctx context.Context, checked []oci.SpecOpts) error {
	l.labels = launchLabels(l.spec, l.img.Target().Digest.String())
	opts := slices.Concat(imageOpts(l.img, l.spec), checked, l.attached.opts, l.w.devices.opts(l.spec.Devices), confinement())
	c, err := l.w.client.NewContainer(ctx, l.spec.ID,
		ctrd.WithImage(l.img),
		ctrd.WithSnapshotter(l.w.snapshotter),
		ctrd.WithNewSnapshot(l.spec.ID, l.img),
		ctrd.WithRuntime(runcRuntime, nil),
		ctrd.WithNewSpec(opts...),
		ctrd.WithContainerLabels(l.labels),
	)
	switch {
	case err == nil:
		l.container = c
		return nil
	case errdefs.IsAlreadyExists(err):
		// Only a container makes the workload exist; a stray snapshot of
		// the same key is a different failure, and not this launch's.
		if exists, _ := l.w.exists(ctx, l.spec.ID); exists {
			return noderuntime.ErrWorkloadExists
		}
	default:
		// The snapshot is made before the spec; a spec that fails (a CDI
		// spec changed since the check) must not leave it.
		l.straySnapshot = true
	}
	return fmt.Errorf("create container: %w", err)
}

// recordStart labels the container with its start time, now. A failure
// does not fail the launch: the workload runs, and failing now would hide
// it; later readers fall back to the container's creation time.
func (l *launching) recordStart(ctx context.Context) time.Time {
	started := time.Now()
	if _, err := l.container.SetLabels(ctx, map[string]string{labelStartedAt: formatTime(started)}); err != nil {
		l.w.log.Warn("record start time", zap.String("workload", l.spec.ID), zap.Error(err))
	}
	return started
}

// undo removes what the failed launch created, even if ctx has ended. What
// it cannot remove is logged: Remove, or the network's reconcile at the
// next start, retries it.
func (l *launching) undo(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	log := l.w.log.With(zap.String("workload", l.spec.ID))
	if l.task != nil {
		if _, err := l.task.Delete(ctx, ctrd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			log.Warn("undo launch: delete task", zap.Error(err))
		}
	}
	if l.container != nil {
		if err := l.container.Delete(ctx, ctrd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			log.Warn("undo launch: delete container", zap.Error(err))
		}
	}
	if l.straySnapshot {
		if err := l.w.client.SnapshotService(l.w.snapshotter).Remove(ctx, l.spec.ID); err != nil && !errdefs.IsNotFound(err) {
			log.Warn("undo launch: remove snapshot", zap.Error(err))
		}
	}
	if l.secretsWritten {
		if err := l.w.secrets.release(l.spec.ID); err != nil {
			log.Warn("undo launch: release secret files", zap.Error(err))
		}
	}
	if l.attached != nil {
		_ = l.attached.wait() // a failed setup is run's to report; the release is the same
		if err := l.w.net.detach(ctx, l.spec.ID); err != nil {
			log.Warn("undo launch: release network", zap.Error(err))
		}
	}
}

// launchLabels are the container's labels: the caller's, and the
// adapter's own that a restarted runtime reads back.
func launchLabels(spec noderuntime.WorkloadSpec, imageDigest string) map[string]string {
	labels := make(map[string]string, len(spec.Labels)+4)
	maps.Copy(labels, spec.Labels)
	labels[labelManaged] = "true"
	labels[labelImageDigest] = imageDigest
	if spec.Output.Dir == "" {
		labels[labelOwnOutput] = "true"
	}
	if len(spec.Devices) > 0 {
		labels[labelDevices] = deviceLabel(spec.Devices)
	}
	return labels
}

// imageOpts start the OCI spec: the image's config, then the workload's
// command, secret env and env over it. Env goes last: a name set twice
// takes its last value, and the agent's WARMFLEET_* variables, at Env's
// end, must win over a secret_env entry of the same name.
func imageOpts(img ctrd.Image, spec noderuntime.WorkloadSpec) []oci.SpecOpts {
	opts := []oci.SpecOpts{oci.WithImageConfig(img)}
	if len(spec.Command) > 0 {
		opts = append(opts, oci.WithProcessArgs(spec.Command...))
	}
	if len(spec.SecretEnv) > 0 {
		opts = append(opts, oci.WithEnv(secretEnv(spec)))
	}
	if len(spec.Env) > 0 {
		opts = append(opts, oci.WithEnv(spec.Env))
	}
	return opts
}
