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

// watchOOM records OOM events as container labels until ctx ends,
// resubscribing when the stream breaks (e.g. containerd restarts).
func (r *Runtime) watchOOM(ctx context.Context) {
	filter := fmt.Sprintf(`topic=="/tasks/oom",namespace==%q`, r.namespace)
	backoff := 100 * time.Millisecond
	for {
		err := r.consumeOOM(ctx, filter)
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("OOM event stream ended; resubscribing", zap.Error(err), zap.Duration("after", backoff))
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

// consumeOOM handles one subscription until it fails or ctx ends, and
// returns only after the client's receiving goroutine has exited.
func (r *Runtime) consumeOOM(ctx context.Context, filter string) error {
	subCtx, cancel := context.WithCancel(ctx)
	envs, errs := r.client.Subscribe(subCtx, filter)
	defer func() {
		cancel()
		for range errs { // closed when the receiver goroutine returns
		}
	}()
	for {
		select {
		case env := <-envs:
			r.handleOOM(ctx, env)
		case err := <-errs:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (r *Runtime) handleOOM(ctx context.Context, env *events.Envelope) {
	if env == nil || env.Event == nil {
		return
	}
	v, err := typeurl.UnmarshalAny(env.Event)
	if err != nil {
		r.log.Warn("decode OOM event", zap.Error(err))
		return
	}
	ev, ok := v.(*apievents.TaskOOM)
	if !ok {
		return
	}
	log := r.log.With(zap.String("workload", ev.ContainerID))
	container, err := r.client.LoadContainer(ctx, ev.ContainerID)
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
func (r *Runtime) cgroupOOMKilled(ctx context.Context, container ctrd.Container) bool {
	spec, err := container.Spec(ctx)
	if err != nil || spec.Linux == nil {
		return false
	}
	n, err := oomKillCount(cgroupRoot, spec.Linux.CgroupsPath)
	if err != nil {
		r.log.Debug("read OOM-kill counter", zap.String("workload", container.ID()), zap.Error(err))
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

// swapLimitSupported says whether runc can cap memory+swap. On cgroup v1
// that needs swap accounting (memory.memsw.*), which kernels may lack; runc
// fails the start if asked for it then. On v2 runc skips it when absent.
func swapLimitSupported() bool {
	if isCgroup2(cgroupRoot) {
		return true
	}
	_, err := os.Stat(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes"))
	return err == nil
}
