package containerd

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// wait blocks until the workload's task exits and returns its final status.
// It reattaches to a task started by an earlier process: containerd's shim
// keeps the task (and its exit status) while the agent is down. A workload
// without a task returns at once with what its labels recorded.
func (w *workloads) wait(ctx context.Context, id string) (noderuntime.WorkloadStatus, error) {
	container, err := w.load(ctx, id)
	if err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	task, err := container.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return w.status(ctx, container)
	}
	if err != nil {
		return noderuntime.WorkloadStatus{}, fmt.Errorf("wait %s: load task: %w", id, err)
	}
	es, err := waitExit(ctx, task)
	if err != nil {
		if errdefs.IsNotFound(err) { // task deleted while we waited
			return w.status(ctx, container)
		}
		return noderuntime.WorkloadStatus{}, fmt.Errorf("wait %s: %w", id, err)
	}
	st, err := w.status(ctx, container)
	if err != nil {
		return noderuntime.WorkloadStatus{}, err
	}
	if st.State != noderuntime.WorkloadExited {
		// The task was deleted between its exit and our look: trust the
		// exit we saw, and keep it for later readers.
		st.State = noderuntime.WorkloadExited
		st.ExitCode = int(es.ExitCode())
		st.FinishedAt = es.ExitTime()
		clampStart(&st)
		w.recordExit(ctx, container, nil, st)
	}
	return st, nil
}

// waitExit waits for the task to exit or ctx to end. It returns only after
// the client's waiting goroutine has finished.
func waitExit(ctx context.Context, task ctrd.Task) (ctrd.ExitStatus, error) {
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := task.Wait(waitCtx)
	if err != nil {
		return ctrd.ExitStatus{}, err
	}
	select {
	case es := <-ch:
		if err := es.Error(); err != nil {
			if ctx.Err() != nil {
				return ctrd.ExitStatus{}, ctx.Err()
			}
			return ctrd.ExitStatus{}, err
		}
		return es, nil
	case <-ctx.Done():
		cancel()
		for range ch { // closed once the goroutine's Wait call returns
		}
		return ctrd.ExitStatus{}, ctx.Err()
	}
}

// stop sends SIGTERM to the workload's main process, waits up to grace for
// it to exit, then SIGKILLs every process in the container. A workload that
// has exited or never got a task is not an error; an unknown id returns
// noderuntime.ErrWorkloadNotFound.
func (w *workloads) stop(ctx context.Context, id string, grace time.Duration) error {
	container, err := w.load(ctx, id)
	if err != nil {
		return err
	}
	task, err := container.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stop %s: load task: %w", id, err)
	}
	// Waiting starts before the signal so the exit cannot be missed.
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	exited, err := task.Wait(waitCtx)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("stop %s: wait: %w", id, err)
	}
	defer func() {
		cancel()
		for range exited {
		}
	}()

	if err := task.Kill(ctx, syscall.SIGTERM); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("stop %s: SIGTERM: %w", id, err)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-exited:
	case <-timer.C:
		w.log.Info("workload ignored SIGTERM; killing", zap.String("workload", id), zap.Duration("grace", grace))
		if err := task.Kill(ctx, syscall.SIGKILL, ctrd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("stop %s: SIGKILL: %w", id, err)
		}
		select {
		case <-exited:
		case <-ctx.Done():
			return fmt.Errorf("stop %s: waiting for exit after SIGKILL: %w", id, ctx.Err())
		}
	case <-ctx.Done():
		return fmt.Errorf("stop %s: %w", id, ctx.Err())
	}
	// Record the exit now, while the task still holds it.
	if _, err := w.status(ctx, container); err != nil {
		w.log.Warn("record exit after stop", zap.String("workload", id), zap.Error(err))
	}
	return nil
}

// finish deletes an exited workload's task (its exit is recorded in the
// container's labels first), which closes the workload's output pipes; the
// shim then waits for the log writer to read them to their end and exit.
// The container stays for Inspect, Wait and Remove.
func (w *workloads) finish(ctx context.Context, id string) error {
	err := w.finishTask(ctx, id)
	if err != nil && !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		return err
	}
	// No process of the workload is left to read its secret files.
	if rerr := w.secrets.release(id); rerr != nil {
		return fmt.Errorf("finish %s: %w", id, rerr)
	}
	return err
}

// finishTask is finish's deletion of the exited task.
func (w *workloads) finishTask(ctx context.Context, id string) error {
	container, err := w.load(ctx, id)
	if err != nil {
		return err
	}
	st, err := w.status(ctx, container)
	if err != nil {
		return fmt.Errorf("finish %s: %w", id, err)
	}
	if st.State != noderuntime.WorkloadExited {
		if st.State == noderuntime.WorkloadUnknown {
			return nil // no task: nothing holds the output open
		}
		return fmt.Errorf("finish %s: %w", id, noderuntime.ErrWorkloadRunning)
	}
	task, err := container.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("finish %s: load task: %w", id, err)
	}
	if _, err := task.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("finish %s: delete task: %w", id, err)
	}
	return nil
}
