package containerd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	ctrd "github.com/containerd/containerd"
	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/events"
	"github.com/containerd/typeurl/v2"
	"go.uber.org/zap"
)

// OOM kills are known two ways. containerd's shim publishes /tasks/oom when
// the kernel reports an OOM in the container's cgroup; watchOOM records it
// as a label, which outlives the cgroup. And the cgroup's own oom_kill
// counter, read when the task is seen stopped, covers events missed while
// the agent was down or still in flight when the exit is seen (the shim
// publishes OOM and exit independently, so their order is not guaranteed).

const cgroupRoot = "/sys/fs/cgroup"

// oomWatcher records the OOM events of one namespace's containers as
// their labels, from its start until close.
type oomWatcher struct {
	client *ctrd.Client
	log    *zap.Logger
	stop   context.CancelFunc
	done   chan struct{}
}

// watchOOM starts watching namespace; ctx (scoped to it) carries values
// only: the watcher ends with close, not with ctx.
func watchOOM(ctx context.Context, client *ctrd.Client, namespace string, log *zap.Logger) *oomWatcher {
	ctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	w := &oomWatcher{client: client, log: log, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.watch(ctx, namespace)
	}()
	return w
}

// close stops the watcher and waits for it to end.
func (w *oomWatcher) close() {
	w.stop()
	<-w.done
}

// watch records OOM events until ctx ends, resubscribing when the stream
// breaks (e.g. containerd restarts).
func (w *oomWatcher) watch(ctx context.Context, namespace string) {
	filter := fmt.Sprintf(`topic=="/tasks/oom",namespace==%q`, namespace)
	backoff := 100 * time.Millisecond
	for {
		err := w.consume(ctx, filter)
		if ctx.Err() != nil {
			return
		}
		w.log.Warn("OOM event stream ended; resubscribing", zap.Error(err), zap.Duration("after", backoff))
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

// consume handles one subscription until it fails or ctx ends, and
// returns only after the client's receiving goroutine has exited.
func (w *oomWatcher) consume(ctx context.Context, filter string) error {
	subCtx, cancel := context.WithCancel(ctx)
	envs, errs := w.client.Subscribe(subCtx, filter)
	defer func() {
		cancel()
		for range errs { // closed when the receiver goroutine returns
		}
	}()
	for {
		select {
		case env := <-envs:
			w.handle(ctx, env)
		case err := <-errs:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// handle records one event's OOM kill on its container.
func (w *oomWatcher) handle(ctx context.Context, env *events.Envelope) {
	if env == nil || env.Event == nil {
		return
	}
	v, err := typeurl.UnmarshalAny(env.Event)
	if err != nil {
		w.log.Warn("decode OOM event", zap.Error(err))
		return
	}
	ev, ok := v.(*apievents.TaskOOM)
	if !ok {
		return
	}
	log := w.log.With(zap.String("workload", ev.ContainerID))
	container, err := w.client.LoadContainer(ctx, ev.ContainerID)
	if err != nil {
		if !errdefs.IsNotFound(err) {
			log.Warn("load container for OOM event", zap.Error(err))
		}
		return
	}
	if _, err := container.SetLabels(ctx, map[string]string{labelOOMKilled: "true"}); err != nil && !errdefs.IsNotFound(err) {
		log.Warn("record OOM", zap.Error(err))
		return
	}
	log.Info("workload hit its memory limit (OOM kill)")
}

// cgroupOOMKilled reads the kernel's OOM-kill counter of the container's
// memory cgroup. It exists until the task is deleted; false when unreadable.
func (w *workloads) cgroupOOMKilled(ctx context.Context, container ctrd.Container) bool {
	spec, err := container.Spec(ctx)
	if err != nil || spec.Linux == nil {
		return false
	}
	n, err := oomKillCount(cgroupRoot, spec.Linux.CgroupsPath)
	if err != nil {
		w.log.Debug("read OOM-kill counter", zap.String("workload", container.ID()), zap.Error(err))
		return false
	}
	return n > 0
}

// oomKillCount reads oom_kill from memory.events (cgroup v2) or
// memory.oom_control (cgroup v1) of an absolute cgroupfs-style path.
func oomKillCount(root, cgroupsPath string) (uint64, error) {
	// "slice:prefix:name" paths belong to the systemd driver, which this
	// adapter never asks for.
	if !strings.HasPrefix(cgroupsPath, "/") {
		return 0, fmt.Errorf("cgroup path %q is not a cgroupfs path", cgroupsPath)
	}
	file := filepath.Join(root, "memory", cgroupsPath, "memory.oom_control")
	if isCgroup2(root) {
		file = filepath.Join(root, cgroupsPath, "memory.events")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == "oom_kill" {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s has no oom_kill counter", file)
}

func isCgroup2(root string) bool {
	_, err := os.Stat(filepath.Join(root, "cgroup.controllers"))
	return err == nil
}
