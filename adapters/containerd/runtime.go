// Package containerd owns running workloads through a containerd daemon: it
// implements noderuntime.Runtime on top of the containerd client, keeping every
// fact it needs to survive an agent restart (start time, exit, OOM) in
// containerd itself rather than in the agent's memory.
package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/sirupsen/logrus"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/cdispec"
	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Defaults for Options.
const (
	DefaultAddress   = "/run/containerd/containerd.sock"
	DefaultNamespace = "warmfleet"
	// runcRuntime is containerd's runc shim v2, the only runtime we use.
	runcRuntime = "io.containerd.runc.v2"
)

// Options configures a Runtime.
type Options struct {
	// Address is containerd's gRPC socket; DefaultAddress when empty.
	Address string
	// Namespace isolates this agent's images and containers in containerd;
	// DefaultNamespace when empty.
	Namespace string
	// ImageDir holds OCI image archives (<hex>.tar) EnsureImage imports
	// before it tries a registry. Empty disables archive lookup.
	ImageDir string
	// Snapshotter is the containerd snapshotter for rootfs. Empty means
	// "overlayfs", falling back to "native" when overlayfs did not load.
	Snapshotter string
	// LogDir holds the output directories of workloads whose spec names
	// none, as <LogDir>/<id>. Empty means a directory under os.TempDir
	// named for the namespace.
	LogDir string
	// LogWriter is the binary containerd's shim runs beside each workload
	// to keep its output (package nodelog's writer: any binary that calls
	// nodelog.WriterMain first, warmfleet-agent among them). Empty means
	// this process's own executable. New checks that it answers.
	LogWriter string
	// StateDir holds what the runtime keeps per workload beside containerd:
	// network records, resolv.conf copies, network namespaces and (by
	// default) the IPAM leases. Empty means a directory under os.TempDir
	// named for the namespace. Give each runtime its own.
	StateDir string
	// Network configures the bridge network and workloads' DNS (network.go).
	Network NetworkOptions
	// Logger gets the adapter's logs; zap.NewNop when nil.
	Logger *zap.Logger
	// CDISpecDirs are the directories of the CDI specs a workload's
	// Devices are resolved against, lowest priority first;
	// cdispec.DefaultDirs (/etc/cdi, /var/run/cdi) when empty. They are
	// reread at every Launch that names devices.
	CDISpecDirs []string
	// InsecureRegistries are registry hosts (host[:port]) pulled from over
	// plain HTTP, besides loopback hosts, which always are.
	InsecureRegistries []string
}

// Runtime runs workloads through containerd. It implements noderuntime.Runtime
// and is safe for concurrent use.
type Runtime struct {
	client      *ctrd.Client
	namespace   string
	imageDir    string
	snapshotter string
	logDir      string
	logWriter   string
	log         *zap.Logger
	clientLog   *logrus.Entry // the containerd client's logrus lines, into log
	cdi         *cdispec.Registry
	insecure    map[string]bool // Options.InsecureRegistries, canonical

	imageLocks    keyed.Mutex // by image digest
	workloadLocks keyed.Mutex // by workload id: a launch and a remove of one id never overlap
	net           *network
	memlockMax    uint64 // what MemlockUnlimited gives (limits.go)

	// stop ends background work (the OOM watcher); done says it ended.
	stop      context.CancelFunc
	done      sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

var _ noderuntime.Runtime = (*Runtime)(nil)

// New connects to containerd and starts watching for OOM events. ctx bounds
// only the connection and the checks New makes; Close ends the Runtime.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	if opts.Address == "" {
		opts.Address = DefaultAddress
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.LogDir == "" {
		opts.LogDir = filepath.Join(os.TempDir(), "warmfleet-"+opts.Namespace+"-logs")
	}
	if opts.StateDir == "" {
		opts.StateDir = filepath.Join(os.TempDir(), "warmfleet-"+opts.Namespace+"-state")
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.LogWriter == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("containerd runtime: find this executable for the log writer: %w", err)
		}
		opts.LogWriter = self
	}
	if err := nodelog.Probe(ctx, opts.LogWriter); err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	log := opts.Logger.With(zap.String("runtime", "containerd"), zap.String("namespace", opts.Namespace))

	// The shim opens the log file itself, from another working directory.
	abs, err := filepath.Abs(opts.LogDir)
	if err != nil {
		return nil, fmt.Errorf("containerd: log dir %q: %w", opts.LogDir, err)
	}
	opts.LogDir = abs
	if err := os.MkdirAll(opts.LogDir, 0o700); err != nil {
		return nil, fmt.Errorf("containerd runtime: create log dir: %w", err)
	}
	if opts.StateDir, err = filepath.Abs(opts.StateDir); err != nil {
		return nil, fmt.Errorf("containerd runtime: state dir: %w", err)
	}
	netw, err := newNetwork(opts.Network, opts.StateDir, log)
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	memlockMax, err := memlockCeiling()
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	if memlockMax != noderuntime.Unlimited {
		log.Warn("without CAP_SYS_RESOURCE, workloads that need unlimited memlock get this process's own hard limit", zap.Uint64("memlock_bytes", memlockMax))
	}
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		if timeout = time.Until(dl); timeout <= 0 {
			return nil, fmt.Errorf("containerd runtime: connect: %w", context.DeadlineExceeded)
		}
	}
	client, err := ctrd.New(opts.Address, ctrd.WithDefaultNamespace(opts.Namespace), ctrd.WithTimeout(timeout))
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: connect to %s: %w", opts.Address, err)
	}
	r := &Runtime{
		client:     client,
		namespace:  opts.Namespace,
		imageDir:   opts.ImageDir,
		logDir:     opts.LogDir,
		logWriter:  opts.LogWriter,
		net:        netw,
		memlockMax: memlockMax,
		log:        log,
		clientLog:  newClientLog(log),
		cdi:        cdispec.New(opts.CDISpecDirs, log),
		insecure:   map[string]bool{},
	}
	for _, h := range opts.InsecureRegistries {
		r.insecure[schemas.CanonicalRegistry(h)] = true
	}
	nsctx := r.ctx(ctx)
	if _, err := client.Version(nsctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("containerd runtime: daemon at %s does not answer: %w", opts.Address, err)
	}
	r.snapshotter, err = chooseSnapshotter(nsctx, client, opts.Snapshotter)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	log.Info("connected", zap.String("address", opts.Address), zap.String("snapshotter", r.snapshotter))
	// What a crashed predecessor attached to workloads that are gone is
	// released before anything new is attached.
	if err := r.net.reconcile(nsctx, r.containerExists); err != nil {
		log.Warn("network reconcile left some state behind; it is retried at the next start", zap.Error(err))
	}

	// The watcher must not die with New's ctx, only with Close.
	watchCtx, stop := context.WithCancel(context.WithoutCancel(nsctx))
	r.stop = stop
	r.done.Add(1)
	go func() {
		defer r.done.Done()
		r.watchOOM(watchCtx)
	}()
	return r, nil
}

// Close stops background work and closes the connection; calling it again
// does nothing. Workloads keep running: containerd's shims own them, not
// this process.
func (r *Runtime) Close() error {
	r.closeOnce.Do(func() {
		r.stop()
		r.done.Wait()
		r.closeErr = r.client.Close()
	})
	return r.closeErr
}

// Snapshotter reports the snapshotter in use (after any fallback).
func (r *Runtime) Snapshotter() string { return r.snapshotter }

// OutputDir is the output directory of a workload whose spec names none.
// Remove deletes it, so read it before removing the workload.
func (r *Runtime) OutputDir(id string) string {
	return filepath.Join(r.logDir, id)
}

// NetworkModes are the network modes this runtime gives workloads:
// bridge only when its CNI plugins were found.
func (r *Runtime) NetworkModes() []noderuntime.NetworkMode { return r.net.Modes() }

// containerExists reports whether containerd holds container id.
func (r *Runtime) containerExists(ctx context.Context, id string) (bool, error) {
	_, err := r.client.LoadContainer(r.ctx(ctx), id)
	switch {
	case err == nil:
		return true, nil
	case errdefs.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("look up container %s: %w", id, err)
}

// Info names containerd and its version.
func (r *Runtime) Info(ctx context.Context) (noderuntime.RuntimeInfo, error) {
	v, err := r.client.Version(r.ctx(ctx))
	if err != nil {
		return noderuntime.RuntimeInfo{}, fmt.Errorf("containerd version: %w", err)
	}
	return noderuntime.RuntimeInfo{Name: "containerd", Version: v.Version, Platform: hostPlatform(), ExactImageInventory: true, BindMounts: true}, nil
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
