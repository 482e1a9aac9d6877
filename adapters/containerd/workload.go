package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/oci"
	digest "github.com/opencontainers/go-digest"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// cleanupTimeout bounds the undo of a failed Launch, which runs even when
// the caller's context has ended.
const cleanupTimeout = 30 * time.Second

// Launch creates the container (new snapshot, OCI spec from the image plus
// spec's command, env and limits) and starts its task with stdout and
// stderr going to LogPath(id). On failure nothing is left behind.
func (r *Runtime) Launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	ctx = r.ctx(ctx)
	if spec.ID == "" {
		return noderuntime.WorkloadStatus{}, errors.New("launch: empty workload id")
	}
	for k := range spec.Labels {
		if strings.HasPrefix(k, labelPrefix) {
			return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: label %q uses the reserved prefix %q", spec.ID, k, labelPrefix)
		}
	}
	unlock := r.workloadLocks.Lock(spec.ID)
	defer unlock()
	steps := newLaunchSteps()
	defer func() { r.log.Debug("launch steps", zap.String("workload", spec.ID), steps.fields()) }()
	if _, err := r.client.LoadContainer(ctx, spec.ID); err == nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: %w", spec.ID, noderuntime.ErrWorkloadExists)
	} else if !errdefs.IsNotFound(err) {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: look up container: %w", spec.ID, err)
	}
	steps.mark("lookup")

	mounts, err := bindMounts(spec.Mounts)
	if err != nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	limits, err := limitOpts(spec, r.memlockMax)
	if err != nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	if err := r.checkDevices(spec.Devices); err != nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	steps.mark("checks")
	img, err := r.imageForLaunch(ctx, spec)
	if err != nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	steps.mark("image")
	// The network comes last before the container: everything that can be
	// refused cheaply has been, and undoLaunch releases it. Its setup goes
	// on while the container and task are created.
	att, err := r.net.attach(ctx, spec.ID, spec.Network)
	if err != nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	steps.mark("network_ns")

	labels := make(map[string]string, len(spec.Labels)+1)
	for k, v := range spec.Labels {
		labels[k] = v
	}
	labels[labelManaged] = "true"
	labels[labelImageDigest] = img.Target().Digest.String()
	if spec.Output.Dir == "" {
		labels[labelOwnOutput] = "true"
	}
	opts := slices.Concat(specOpts(img, spec), []oci.SpecOpts{mounts}, limits, att.opts)
	if len(spec.Devices) > 0 {
		labels[labelDevices] = deviceLabel(spec.Devices)
		opts = append(opts, r.withDevices(spec.Devices))
	}
	container, err := r.client.NewContainer(ctx, spec.ID,
		ctrd.WithImage(img),
		ctrd.WithSnapshotter(r.snapshotter),
		ctrd.WithNewSnapshot(spec.ID, img),
		ctrd.WithRuntime(runcRuntime, nil),
		ctrd.WithNewSpec(opts...),
		ctrd.WithContainerLabels(labels),
	)
	if err != nil {
		r.releaseNetwork(ctx, spec.ID, att)
		if errdefs.IsAlreadyExists(err) {
			// Only a container makes the workload exist; a stray snapshot
			// of the same key is a different failure.
			if _, lerr := r.client.LoadContainer(ctx, spec.ID); lerr == nil {
				return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: %w", spec.ID, noderuntime.ErrWorkloadExists)
			}
		} else {
			// The snapshot is made before the spec; a spec that fails
			// (a CDI spec changed since checkDevices) must not leave it.
			r.removeSnapshot(ctx, spec.ID)
		}
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: create container: %w", spec.ID, err)
	}
	steps.mark("container")

	if spec.Output.Dir == "" {
		// A reused id must not inherit an earlier workload's output.
		if err := os.RemoveAll(r.OutputDir(spec.ID)); err != nil {
			r.undoLaunch(ctx, container, nil, att)
			return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: clear old output: %w", spec.ID, err)
		}
	}
	steps.mark("output")
	// The shim runs the log writer, so output keeps reaching disk while
	// the agent is down and never passes through the agent's own stdio.
	task, err := container.NewTask(ctx, cio.BinaryIO(r.logWriter, map[string]string{nodelog.WriterFlag: r.writerSpec(spec).Encode()}))
	if err != nil {
		r.undoLaunch(ctx, container, nil, att)
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: create task: %w", spec.ID, err)
	}
	steps.mark("task")
	// The process starts in a namespace whose interfaces are up.
	if err := att.wait(); err != nil {
		r.undoLaunch(ctx, container, task, att)
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	steps.mark("network")
	if err := task.Start(ctx); err != nil {
		r.undoLaunch(ctx, container, task, att)
		return noderuntime.WorkloadStatus{}, fmt.Errorf("launch %s: start task: %w", spec.ID, err)
	}
	steps.mark("start")
	started := time.Now()
	if _, err := container.SetLabels(ctx, map[string]string{labelStartedAt: formatTime(started)}); err != nil {
		// The workload runs; failing Launch now would hide it. Later
		// readers fall back to the container's creation time.
		r.log.Warn("record start time", zap.String("workload", spec.ID), zap.Error(err))
	}
	steps.mark("label")
	r.markUsed(ctx, img.Target().Digest)
	steps.mark("mark_used")
	r.log.Info("launched workload", zap.String("workload", spec.ID), zap.Uint32("pid", task.Pid()), zap.Strings("devices", spec.Devices))
	return noderuntime.WorkloadStatus{
		ID:             spec.ID,
		State:          noderuntime.WorkloadRunning,
		Labels:         userLabels(labels),
		StartedAt:      started,
		Devices:        labelledDevices(labels),
		ManifestDigest: labels[labelImageDigest],
	}, nil
}

// writerSpec is what the log writer of spec's workload is told.
func (r *Runtime) writerSpec(spec noderuntime.WorkloadSpec) nodelog.WriterSpec {
	dir := spec.Output.Dir
	if dir == "" {
		dir = r.OutputDir(spec.ID)
	}
	return nodelog.WriterSpec{Dir: dir, Limit: nodelog.Limit{BytesPerSecond: spec.Output.BytesPerSecond, Burst: spec.Output.Burst}}
}

// imageForLaunch finds the pinned image in containerd and makes sure it is
// unpacked. It does not fetch: that is EnsureImage's job.
func (r *Runtime) imageForLaunch(ctx context.Context, spec noderuntime.WorkloadSpec) (ctrd.Image, error) {
	want, err := digest.Parse(spec.ManifestDigest)
	if err != nil {
		return nil, fmt.Errorf("invalid manifest digest %q: %w", spec.ManifestDigest, err)
	}
	rec, found, err := r.findImage(ctx, want, spec.ImageReference, spec.Platform)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%w: %s (%s) is not in containerd; EnsureImage first", noderuntime.ErrImageNotFound, spec.ImageReference, want)
	}
	// The platform names which build of an index runs; a single manifest
	// of another platform was refused by findImage.
	img := ctrd.NewImageWithPlatform(r.client, rec, platformMatcher(spec.Platform))
	if err := r.unpack(ctx, img); err != nil {
		return nil, err
	}
	return img, nil
}

// specOpts builds the OCI spec: the image's config, then the overrides.
func specOpts(img ctrd.Image, spec noderuntime.WorkloadSpec) []oci.SpecOpts {
	opts := []oci.SpecOpts{oci.WithImageConfig(img)}
	if len(spec.Command) > 0 {
		opts = append(opts, oci.WithProcessArgs(spec.Command...))
	}
	if len(spec.Env) > 0 {
		opts = append(opts, oci.WithEnv(spec.Env))
	}
	if spec.CPUMillis > 0 {
		const period = 100_000 // µs, the kernel's default CFS period
		quota := spec.CPUMillis * period / 1000
		if quota < 1000 { // the kernel's minimum quota
			quota = 1000
		}
		opts = append(opts, oci.WithCPUCFS(quota, period))
	}
	if spec.MemoryBytes > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(spec.MemoryBytes)))
		if swapLimitSupported() {
			// memory+swap == memory: the limit cannot be dodged by swapping,
			// so exceeding it is an OOM kill, not a slowdown.
			opts = append(opts, oci.WithMemorySwap(spec.MemoryBytes))
		}
	}
	return opts
}

// undoLaunch removes what a failed Launch created, even if ctx has ended.
func (r *Runtime) undoLaunch(ctx context.Context, container ctrd.Container, task ctrd.Task, att *attachment) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if task != nil {
		if _, err := task.Delete(ctx, ctrd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			r.log.Warn("undo launch: delete task", zap.String("workload", container.ID()), zap.Error(err))
		}
	}
	if err := container.Delete(ctx, ctrd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		r.log.Warn("undo launch: delete container", zap.String("workload", container.ID()), zap.Error(err))
	}
	r.releaseNetwork(ctx, container.ID(), att)
}

// releaseNetwork undoes a launch's network once its setup has ended,
// logging what it could not release: the record stays, and Remove or the
// next start retries.
func (r *Runtime) releaseNetwork(ctx context.Context, id string, att *attachment) {
	_ = att.wait() // a failed setup is the caller's to report; the release is the same
	if err := r.net.detach(ctx, id); err != nil {
		r.log.Warn("undo launch: release network", zap.String("workload", id), zap.Error(err))
	}
}

// Inspect reports the workload's current status.
func (r *Runtime) Inspect(ctx context.Context, id string) (noderuntime.WorkloadStatus, error) {
	ctx = r.ctx(ctx)
	container, err := r.load(ctx, id)
	if err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	return r.status(ctx, container)
}

// List returns the workloads this adapter created in its namespace.
func (r *Runtime) List(ctx context.Context) ([]noderuntime.WorkloadStatus, error) {
	ctx = r.ctx(ctx)
	containers, err := r.client.Containers(ctx, managedFilter)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make([]noderuntime.WorkloadStatus, 0, len(containers))
	for _, c := range containers {
		st, err := r.status(ctx, c)
		if errdefs.IsNotFound(err) {
			continue // removed while we listed
		}
		if err != nil {
			return nil, fmt.Errorf("status of %s: %w", c.ID(), err)
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Remove deletes the workload's task (killing it if it still runs), its
// container, snapshot and log, and releases its network. A missing
// workload is not an error; its network, if a failed Remove left it, is
// released all the same.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	ctx = r.ctx(ctx)
	unlock := r.workloadLocks.Lock(id)
	defer unlock()
	container, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		if err := r.net.detach(ctx, id); err != nil {
			return fmt.Errorf("remove %s: %w", id, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	info, err := container.Info(ctx)
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove %s: container info: %w", id, err)
	}
	ownOutput := info.Labels[labelOwnOutput] == "true"
	task, err := container.Task(ctx, nil)
	switch {
	case err == nil:
		if _, err := task.Delete(ctx, ctrd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove %s: delete task: %w", id, err)
		}
	case !errdefs.IsNotFound(err):
		return fmt.Errorf("remove %s: load task: %w", id, err)
	}
	if err := container.Delete(ctx, ctrd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove %s: delete container: %w", id, err)
	}
	if ownOutput {
		if err := os.RemoveAll(r.OutputDir(id)); err != nil {
			r.log.Warn("remove output", zap.String("workload", id), zap.Error(err))
		}
	}
	if err := r.net.detach(ctx, id); err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	r.log.Info("removed workload", zap.String("workload", id))
	return nil
}

// load finds a container, mapping absence to noderuntime.ErrWorkloadNotFound.
func (r *Runtime) load(ctx context.Context, id string) (ctrd.Container, error) {
	container, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("workload %s: %w", id, noderuntime.ErrWorkloadNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("workload %s: load container: %w", id, err)
	}
	return container, nil
}

// status combines the task's live state with what the labels recorded.
func (r *Runtime) status(ctx context.Context, container ctrd.Container) (noderuntime.WorkloadStatus, error) {
	info, err := container.Info(ctx)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return noderuntime.WorkloadStatus{}, fmt.Errorf("workload %s: %w: %w", container.ID(), noderuntime.ErrWorkloadNotFound, err)
		}
		return noderuntime.WorkloadStatus{}, fmt.Errorf("workload %s: container info: %w", container.ID(), err)
	}
	st := noderuntime.WorkloadStatus{
		ID:             info.ID,
		State:          noderuntime.WorkloadUnknown,
		Labels:         userLabels(info.Labels),
		StartedAt:      parseTime(info.Labels[labelStartedAt]),
		OOMKilled:      info.Labels[labelOOMKilled] == "true",
		Devices:        labelledDevices(info.Labels),
		ManifestDigest: r.imageDigestOf(ctx, info),
	}
	task, err := container.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		// No task: deleted, never started, or lost with a reboot. Only an
		// exit someone recorded is known; anything else is unknown.
		if code, finished, ok := storedExit(info.Labels); ok {
			st.State, st.ExitCode, st.FinishedAt = noderuntime.WorkloadExited, code, finished
			clampStart(&st)
		}
		return st, nil
	}
	if err != nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("workload %s: load task: %w", info.ID, err)
	}
	ts, err := task.Status(ctx)
	if errdefs.IsNotFound(err) {
		return st, nil // deleted between the two calls
	}
	if err != nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("workload %s: task status: %w", info.ID, err)
	}
	switch ts.Status {
	case ctrd.Created:
		st.State = noderuntime.WorkloadCreated
	case ctrd.Running, ctrd.Paused, ctrd.Pausing:
		st.State = noderuntime.WorkloadRunning
		st.StartedAt = startedAt(info)
	case ctrd.Stopped:
		st.State = noderuntime.WorkloadExited
		st.StartedAt = startedAt(info)
		st.ExitCode = int(ts.ExitStatus)
		st.FinishedAt = ts.ExitTime
		clampStart(&st)
		st.OOMKilled = st.OOMKilled || r.cgroupOOMKilled(ctx, container)
		r.recordExit(ctx, container, info.Labels, st)
	}
	return st, nil
}

// startedAt is the recorded start, else (the agent died between starting
// the task and recording it) the container's creation, which precedes the
// start by the time it takes to create a task.
func startedAt(info containers.Container) time.Time {
	if t := parseTime(info.Labels[labelStartedAt]); !t.IsZero() {
		return t
	}
	return info.CreatedAt
}

// clampStart keeps StartedAt <= FinishedAt. Launch takes the start time
// after Start returns, and a process can exit before that; the exit time is
// then the better bound.
func clampStart(st *noderuntime.WorkloadStatus) {
	if !st.FinishedAt.IsZero() && st.StartedAt.After(st.FinishedAt) {
		st.StartedAt = st.FinishedAt
	}
}

// recordExit stores a final status in labels once, so it survives the
// task's deletion or a reboot.
func (r *Runtime) recordExit(ctx context.Context, container ctrd.Container, labels map[string]string, st noderuntime.WorkloadStatus) {
	if _, ok := labels[labelExitCode]; ok && (labels[labelOOMKilled] == "true") == st.OOMKilled {
		return
	}
	if _, err := container.SetLabels(ctx, exitLabels(st)); err != nil && !errdefs.IsNotFound(err) {
		r.log.Warn("record exit", zap.String("workload", st.ID), zap.Error(err))
	}
}

// imageDigestOf is the image a container was launched from: its label, or
// for a container launched before the label existed, what its image name
// points at now ("" when that is gone too).
func (r *Runtime) imageDigestOf(ctx context.Context, info containers.Container) string {
	if d := info.Labels[labelImageDigest]; d != "" {
		return d
	}
	if info.Image == "" {
		return ""
	}
	img, err := r.client.ImageService().Get(ctx, info.Image)
	if err != nil {
		return ""
	}
	return img.Target.Digest.String()
}
