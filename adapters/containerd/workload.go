package containerd

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// workloads are the containers this runtime creates and their tasks: their
// launch (launch.go), status, exit (wait.go) and removal. What a workload
// holds besides its container, its image, network, devices, limits and
// output, comes from the parts it is given.
type workloads struct {
	client      *ctrd.Client
	snapshotter string
	locks       keyed.Mutex // by workload id: a launch and a remove of one id never overlap
	images      *imageStore
	net         *network
	devices     devices
	limits      limits
	output      outputs
	secrets     secretFiles
	log         *zap.Logger
}

// inspect reports the workload's current status.
func (w *workloads) inspect(ctx context.Context, id string) (noderuntime.WorkloadStatus, error) {
	container, err := w.load(ctx, id)
	if err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	return w.status(ctx, container)
}

// list returns the workloads this adapter created in its namespace.
func (w *workloads) list(ctx context.Context) ([]noderuntime.WorkloadStatus, error) {
	containers, err := w.client.Containers(ctx, managedFilter)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make([]noderuntime.WorkloadStatus, 0, len(containers))
	for _, c := range containers {
		st, err := w.status(ctx, c)
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

// remove deletes the workload's task (killing it if it still runs), its
// container, snapshot and log, and releases its network. A missing
// workload is not an error; its network, if a failed remove left it, is
// released all the same.
func (w *workloads) remove(ctx context.Context, id string) error {
	unlock := w.locks.Lock(id)
	defer unlock()
	container, err := w.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		if err := errors.Join(w.secrets.release(id), w.net.detach(ctx, id)); err != nil {
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
		w.output.remove(id)
	}
	if err := w.secrets.release(id); err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	if err := w.net.detach(ctx, id); err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	w.log.Info("removed workload", zap.String("workload", id))
	return nil
}

// load finds a container, mapping absence to noderuntime.ErrWorkloadNotFound.
func (w *workloads) load(ctx context.Context, id string) (ctrd.Container, error) {
	container, err := w.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("workload %s: %w", id, noderuntime.ErrWorkloadNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("workload %s: load container: %w", id, err)
	}
	return container, nil
}

// status combines the task's live state with what the labels recorded.
func (w *workloads) status(ctx context.Context, container ctrd.Container) (noderuntime.WorkloadStatus, error) {
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
		ManifestDigest: w.imageDigestOf(ctx, info),
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
		st.OOMKilled = st.OOMKilled || w.cgroupOOMKilled(ctx, container)
		w.recordExit(ctx, container, info.Labels, st)
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
func (w *workloads) recordExit(ctx context.Context, container ctrd.Container, labels map[string]string, st noderuntime.WorkloadStatus) {
	if _, ok := labels[labelExitCode]; ok && (labels[labelOOMKilled] == "true") == st.OOMKilled {
		return
	}
	if _, err := container.SetLabels(ctx, exitLabels(st)); err != nil && !errdefs.IsNotFound(err) {
		w.log.Warn("record exit", zap.String("workload", st.ID), zap.Error(err))
	}
}

// imageDigestOf is the image a container was launched from: its label, or
// for a container launched before the label existed, what its image name
// points at now ("" when that is gone too).
func (w *workloads) imageDigestOf(ctx context.Context, info containers.Container) string {
	if d := info.Labels[labelImageDigest]; d != "" {
		return d
	}
	if info.Image == "" {
		return ""
	}
	img, err := w.client.ImageService().Get(ctx, info.Image)
	if err != nil {
		return ""
	}
	return img.Target.Digest.String()
}

// exists reports whether containerd holds container id.
func (w *workloads) exists(ctx context.Context, id string) (bool, error) {
	_, err := w.client.LoadContainer(ctx, id)
	switch {
	case err == nil:
		return true, nil
	case errdefs.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("look up container %s: %w", id, err)
}

// hasTask reports whether container id exists with a task: a process of
// it may still read its secret files (finish releases them once the task
// is gone).
func (w *workloads) hasTask(ctx context.Context, id string) (bool, error) {
	container, err := w.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up container %s: %w", id, err)
	}
	_, err = container.Task(ctx, nil)
	switch {
	case err == nil:
		return true, nil
	case errdefs.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("look up task of %s: %w", id, err)
}
