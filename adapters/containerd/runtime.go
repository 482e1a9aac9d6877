// Package containerd owns running workloads through a containerd daemon: it
// implements noderuntime.Runtime on top of the containerd client, keeping every
// fact it needs to survive an agent restart (start time, exit, OOM) in
// containerd itself rather than in the agent's memory.
package containerd

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/sirupsen/logrus"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/cdispec"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Runtime runs workloads through containerd. It implements noderuntime.Runtime
// and is safe for concurrent use. It composes the parts that do the work:
// the image store and inventory, the workloads with their network,
// devices, limits and output, and the OOM watcher. Every call is scoped
// here to the Runtime's namespace before a part sees it.
type Runtime struct {
	client      *ctrd.Client
	namespace   string
	clientLog   *logrus.Entry // the containerd client's logrus lines, into the Runtime's logger
	snapshotter string

	images    *imageStore
	inventory *inventory
	workloads *workloads
	oom       *oomWatcher

	closeOnce sync.Once
	closeErr  error
}

var _ noderuntime.Runtime = (*Runtime)(nil)

// New connects to containerd and starts watching for OOM events. ctx bounds
// only the connection and the checks New makes; Close ends the Runtime.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	opts, err := opts.resolve(ctx)
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	log := opts.Logger.With(zap.String("runtime", "containerd"), zap.String("namespace", opts.Namespace))
	netw, err := newNetwork(opts.Network, opts.StateDir, log)
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	lim, err := newLimits(log)
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	r := &Runtime{namespace: opts.Namespace, clientLog: newClientLog(log)}
	nsctx := r.ctx(ctx)
	if r.client, r.snapshotter, err = connect(nsctx, opts); err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	log.Info("connected", zap.String("address", opts.Address), zap.String("snapshotter", r.snapshotter))

	r.inventory = &inventory{client: r.client, snapshotter: r.snapshotter, log: log}
	r.images = &imageStore{
		client:      r.client,
		snapshotter: r.snapshotter,
		archives:    archiveDir{dir: opts.ImageDir, client: r.client, log: log},
		registry:    newRegistry(r.client, r.snapshotter, opts.ImageDir, opts.InsecureRegistries),
		inventory:   r.inventory,
		log:         log,
	}
	r.workloads = &workloads{
		client:      r.client,
		snapshotter: r.snapshotter,
		images:      r.images,
		net:         netw,
		devices:     devices{cdi: cdispec.New(opts.CDISpecDirs, log)},
		limits:      lim,
		output:      outputs{dir: opts.LogDir, writer: opts.LogWriter, log: log},
		secrets:     secretFiles{dir: filepath.Join(opts.StateDir, "secrets"), log: log},
		log:         log,
	}
	// What a crashed predecessor attached to workloads that are gone is
	// released before anything new is attached.
	if err := netw.reconcile(nsctx, r.workloads.exists); err != nil {
		log.Warn("network reconcile left some state behind; it is retried at the next start", zap.Error(err))
	}
	// Secret files outlive no workload: a predecessor's leftovers go.
	if err := r.workloads.secrets.sweep(nsctx, r.workloads.hasTask); err != nil {
		log.Warn("secret files sweep left some behind; it is retried at the next start", zap.Error(err))
	}
	r.oom = watchOOM(nsctx, r.client, opts.Namespace, log)
	return r, nil
}

// connect opens the client, checks that the daemon answers and chooses
// the snapshotter. ctx bounds it; its deadline, if any, is the client's
// timeout.
func connect(ctx context.Context, opts Options) (*ctrd.Client, string, error) {
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		if timeout = time.Until(dl); timeout <= 0 {
			return nil, "", fmt.Errorf("connect: %w", context.DeadlineExceeded)
		}
	}
	client, err := ctrd.New(opts.Address, ctrd.WithDefaultNamespace(opts.Namespace), ctrd.WithTimeout(timeout))
	if err != nil {
		return nil, "", fmt.Errorf("connect to %s: %w", opts.Address, err)
	}
	if _, err := client.Version(ctx); err != nil {
		client.Close()
		return nil, "", fmt.Errorf("daemon at %s does not answer: %w", opts.Address, err)
	}
	snapshotter, err := chooseSnapshotter(ctx, client, opts.Snapshotter)
	if err != nil {
		client.Close()
		return nil, "", err
	}
	return client, snapshotter, nil
}

// Close stops background work and closes the connection; calling it again
// does nothing. Workloads keep running: containerd's shims own them, not
// this process.
func (r *Runtime) Close() error {
	r.closeOnce.Do(func() {
		r.oom.close()
		r.closeErr = r.client.Close()
	})
	return r.closeErr
}

// Snapshotter reports the snapshotter in use (after any fallback).
func (r *Runtime) Snapshotter() string { return r.snapshotter }

// OutputDir is the output directory of a workload whose spec names none.
// Remove deletes it, so read it before removing the workload.
func (r *Runtime) OutputDir(id string) string { return r.workloads.output.dirOf(id) }

// NetworkModes are the network modes this runtime gives workloads:
// bridge only when its CNI plugins were found.
func (r *Runtime) NetworkModes() []noderuntime.NetworkMode { return r.workloads.net.Modes() }

// Info names containerd and its version.
func (r *Runtime) Info(ctx context.Context) (noderuntime.RuntimeInfo, error) {
	v, err := r.client.Version(r.ctx(ctx))
	if err != nil {
		return noderuntime.RuntimeInfo{}, fmt.Errorf("containerd version: %w", err)
	}
	return noderuntime.RuntimeInfo{Name: "containerd", Version: v.Version, Platform: hostPlatform(), ExactImageInventory: true, BindMounts: true}, nil
}

// EnsureImage makes the build for spec.Platform of the image pinned by
// spec.ManifestDigest present (from containerd, else an archive in
// ImageDir, else a registry pull) under the name spec.Reference, and
// unpacks it when asked. Of a multi-platform index only that build is
// fetched; an image without it is noderuntime.ErrPlatformNotInImage. Each
// success marks the image used now.
func (r *Runtime) EnsureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	return r.images.ensure(r.ctx(ctx), spec)
}

// Images reports every image in this Runtime's namespace, once per target
// digest (several names may point at one image), sorted by digest. Each is
// verified now against the content store and the snapshotter Launch uses.
func (r *Runtime) Images(ctx context.Context) ([]schemas.ImageLocality, error) {
	return r.inventory.localities(r.ctx(ctx))
}

// ImageUsage reports each image's bytes on disk (content for this host's
// platform, plus its unpacked layers) and its last use.
func (r *Runtime) ImageUsage(ctx context.Context) ([]noderuntime.ImageUse, error) {
	return r.inventory.usage(r.ctx(ctx))
}

// RemoveImage deletes every record naming the image and what is left of
// its content and layers that no other image shares, and returns the
// bytes that are gone.
func (r *Runtime) RemoveImage(ctx context.Context, manifestDigest string) (noderuntime.RemovedImage, error) {
	return r.images.remove(r.ctx(ctx), manifestDigest)
}

// Launch creates the container (new snapshot, OCI spec from the image plus
// spec's command, env and limits) and starts its task with stdout and
// stderr going to its output directory. On failure nothing is left behind.
func (r *Runtime) Launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	return r.workloads.launch(r.ctx(ctx), spec)
}

// Inspect reports the workload's current status.
func (r *Runtime) Inspect(ctx context.Context, id string) (noderuntime.WorkloadStatus, error) {
	return r.workloads.inspect(r.ctx(ctx), id)
}

// List returns the workloads this adapter created in its namespace.
func (r *Runtime) List(ctx context.Context) ([]noderuntime.WorkloadStatus, error) {
	return r.workloads.list(r.ctx(ctx))
}

// Wait blocks until the workload's task exits and returns its final status.
// It reattaches to a task started by an earlier process: containerd's shim
// keeps the task (and its exit status) while the agent is down. A workload
// without a task returns at once with what its labels recorded.
func (r *Runtime) Wait(ctx context.Context, id string) (noderuntime.WorkloadStatus, error) {
	return r.workloads.wait(r.ctx(ctx), id)
}

// Stop sends SIGTERM to the workload's main process, waits up to grace for
// it to exit, then SIGKILLs every process in the container. A workload that
// has exited or never got a task is not an error; an unknown id returns
// noderuntime.ErrWorkloadNotFound.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	return r.workloads.stop(r.ctx(ctx), id, grace)
}

// Finish deletes an exited workload's task (its exit is recorded in the
// container's labels first), which closes the workload's output pipes; the
// shim then waits for the log writer to read them to their end and exit.
// The container stays for Inspect, Wait and Remove.
func (r *Runtime) Finish(ctx context.Context, id string) error {
	return r.workloads.finish(r.ctx(ctx), id)
}

// Remove deletes the workload's task (killing it if it still runs), its
// container, snapshot and log, and releases its network. A missing
// workload is not an error; its network, if a failed Remove left it, is
// released all the same.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	return r.workloads.remove(r.ctx(ctx), id)
}

// ctx scopes a call to this Runtime's namespace and routes the client's
// own logging into the Runtime's logger.
func (r *Runtime) ctx(ctx context.Context) context.Context {
	return withClientLog(namespaces.WithNamespace(ctx, r.namespace), r.clientLog)
}

// chooseSnapshotter returns want when given, else overlayfs if it loaded,
// else native. overlayfs fails to load where the root filesystem cannot
// host overlay mounts (e.g. overlay on overlay, some tmpfs setups).
func chooseSnapshotter(ctx context.Context, client *ctrd.Client, want string) (string, error) {
	resp, err := client.IntrospectionService().Plugins(ctx, []string{`type=="io.containerd.snapshotter.v1"`})
	if err != nil {
		return "", fmt.Errorf("list snapshotters: %w", err)
	}
	usable := map[string]bool{}
	for _, p := range resp.Plugins {
		usable[p.ID] = p.InitErr == nil
	}
	if want != "" {
		if !usable[want] {
			return "", fmt.Errorf("snapshotter %q is not loaded in containerd", want)
		}
		return want, nil
	}
	for _, name := range []string{"overlayfs", "native"} {
		if usable[name] {
			return name, nil
		}
	}
	return "", errors.New("neither overlayfs nor native snapshotter is loaded in containerd")
}
