// Package ctrdproc runs a private containerd daemon: its own root, state
// dir, config, log and socket under one directory, the CRI plugin off, runc
// as the runtime. Its owner starts it with Start and ends it with Stop, which
// also ends what a daemon leaves behind (tasks, shims, their cgroups and
// mounts) and keeps the directory, so a daemon started again from it finds
// its images and snapshots still there.
//
// The local capacity provider gives each machine one; internal/testenv gives
// each test one.
package ctrdproc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd"
	"go.uber.org/zap"
)

// Binaries are the programs a private containerd needs on PATH: the daemon,
// the runtime and its shim.
var Binaries = []string{"containerd", "runc", "containerd-shim-runc-v2"}

// ErrUnavailable is why this process cannot run a containerd: not root, or
// a program of Binaries missing. Check's errors wrap it.
var ErrUnavailable = errors.New("containerd unavailable")

// ErrExited is a daemon that exited while it was being started.
var ErrExited = errors.New("containerd exited")

// Error is a failure of one daemon's Op ("start", "stop", ...), naming the
// daemon's directory.
type Error struct {
	Op  string
	Dir string
	Err error
}

func (e *Error) Error() string { return fmt.Sprintf("containerd %s (%s): %v", e.Op, e.Dir, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// Check reports whether this process can run a private containerd: it is
// root and Binaries are on PATH. Its error wraps ErrUnavailable.
func Check() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: containerd needs root; running as uid %d", ErrUnavailable, os.Geteuid())
	}
	for _, b := range Binaries {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("%w: %s not found on PATH (apt-get install -y containerd runc)", ErrUnavailable, b)
		}
	}
	return nil
}

// Config describes a daemon.
type Config struct {
	// Dir holds everything of the daemon: config.toml, containerd.log,
	// root/, state/ and the socket c.sock. It is created when missing and
	// never removed here.
	Dir string
	// Binary is the containerd program (default: containerd on PATH).
	Binary string
	// Namespaces are the containerd namespaces whose cgroups (runc's
	// /<namespace>/<id>, host-global) belong to this daemon alone: Stop
	// kills what is left in them and removes them. Never name a namespace
	// another daemon may use.
	Namespaces []string
	// ReadyTimeout bounds Start's wait for the daemon to answer (default
	// 30s); StopGrace is how long it gets after SIGTERM (default 5s).
	ReadyTimeout, StopGrace time.Duration
	// KillWithParent has the kernel kill the daemon when the thread that
	// started it dies: for tests, whose binary may die without cleanups.
	KillWithParent bool
	Log            *zap.Logger
}

// Daemon is one running containerd.
type Daemon struct {
	// Address is the daemon's gRPC unix socket; Root, State and LogPath
	// are its persistent root, runtime state dir and log; Dir holds them.
	Address, Root, State, LogPath, Dir string

	cfg Config
	// runDir holds the socket when Dir is too deep for one (a unix socket
	// path has at most 107 bytes); Stop removes it.
	runDir string
	cmd    *exec.Cmd
	exited chan struct{}

	stopOnce sync.Once
	stopErr  error
}

// sockMax is the longest socket path Dir/c.sock may be: the daemon also
// listens on <address>.ttrpc, and sun_path holds 107 bytes and a NUL.
const sockMax = 100

// Start starts a daemon from cfg.Dir and waits until it answers. A daemon
// that fails to start leaves nothing running.
func Start(ctx context.Context, cfg Config) (*Daemon, error) {
	if cfg.Binary == "" {
		cfg.Binary = "containerd"
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil || cfg.Dir == "" {
		return nil, &Error{Op: "start", Dir: cfg.Dir, Err: fmt.Errorf("bad directory: %v", err)}
	}
	fail := func(err error) (*Daemon, error) { return nil, &Error{Op: "start", Dir: dir, Err: err} }
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(err)
	}
	d := &Daemon{Dir: dir, Root: filepath.Join(dir, "root"), State: filepath.Join(dir, "state"), LogPath: filepath.Join(dir, "containerd.log"),
		Address: filepath.Join(dir, "c.sock"), cfg: cfg, exited: make(chan struct{})}
	if len(d.Address) > sockMax {
		if d.runDir, err = shortRunDir(dir); err != nil {
			return fail(err)
		}
		d.Address = filepath.Join(d.runDir, "c.sock")
	}
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(d.config()), 0o600); err != nil {
		return fail(err)
	}
	logf, err := os.OpenFile(d.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fail(err)
	}
	d.cmd = exec.Command(cfg.Binary, "--config", cfgPath)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	// Its own process group: a terminal's Ctrl-C is for the owner, which
	// stops the daemon after whatever uses it.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if cfg.KillWithParent {
		d.cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	started := make(chan error, 1)
	go func() {
		// The daemon is started and reaped on one locked thread. With
		// KillWithParent the kernel kills it when the thread that started it
		// exits, and Go ends a thread whose goroutine returns still locked
		// (containerd's pkg/netns does, making network namespaces); this
		// thread lives until the daemon does.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := d.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		// Reaps the daemon; ends when it does, which Stop ensures.
		_ = d.cmd.Wait()
		_ = logf.Close()
		close(d.exited)
	}()
	if err := <-started; err != nil {
		_ = logf.Close()
		return fail(err)
	}
	rctx, cancel := context.WithTimeout(ctx, cfg.ReadyTimeout)
	defer cancel()
	if err := d.waitReady(rctx); err != nil {
		stopErr := d.Stop(context.Background())
		return fail(errors.Join(fmt.Errorf("not ready: %w; log: %s", err, Tail(d.LogPath, 2000)), stopErr))
	}
	cfg.Log.Info("containerd started", zap.String("dir", dir), zap.String("address", d.Address), zap.Int("pid", d.cmd.Process.Pid))
	return d, nil
}

// shortRunDir is a private directory under the temp dir, named after dir,
// for a socket that does not fit under dir.
func shortRunDir(dir string) (string, error) {
	sum := sha256.Sum256([]byte(dir))
	run := filepath.Join(os.TempDir(), "wfctrd-"+hex.EncodeToString(sum[:8]))
	if err := os.Mkdir(run, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	// It must be ours: a directory someone else made in a shared temp dir
	// would let them replace the socket.
	st, err := os.Lstat(run)
	if err != nil {
		return "", err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || !ok || int(sys.Uid) != os.Geteuid() || st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("socket dir %s is not a private directory of this user", run)
	}
	return run, nil
}

// config is the daemon's configuration: the CRI plugin off (callers talk to
// containerd directly, and CRI would want CNI), and plugins that only fail
// to load or write outside Dir off too.
func (d *Daemon) config() string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = %q
`, d.Root, d.State, d.Address)
}

// waitReady polls the socket until the daemon answers a Version call.
func (d *Daemon) waitReady(ctx context.Context) error {
	for {
		select {
		case <-d.exited:
			return ErrExited
		default:
		}
		if conn, err := net.DialTimeout("unix", d.Address, time.Second); err == nil {
			_ = conn.Close()
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("socket %s not accepting connections: %w", d.Address, ctx.Err())
		case <-d.exited:
			return ErrExited
		case <-time.After(20 * time.Millisecond):
		}
	}
	client, err := containerd.New(d.Address, containerd.WithTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer client.Close()
	_, err = client.Version(ctx)
	return err
}

// Exited closes when the daemon process has exited, for any reason.
func (d *Daemon) Exited() <-chan struct{} { return d.exited }

// Pid is the daemon's process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Stop ends the daemon and everything it left: its tasks first (so their
// shims exit and unmount rootfs cleanly), then the daemon (SIGTERM, SIGKILL
// after StopGrace or when ctx ends), then leftover shims, the cgroups of
// cfg.Namespaces and mounts under Dir. Dir stays. Stop is idempotent; its
// error says what could not be cleaned.
func (d *Daemon) Stop(ctx context.Context) error {
	d.stopOnce.Do(func() { d.stopErr = d.stop(ctx) })
	return d.stopErr
}

func (d *Daemon) stop(ctx context.Context) error {
	log := d.cfg.Log.With(zap.String("dir", d.Dir))
	var errs []error
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if err := DeleteAllTasks(tctx, d.Address, d.exited); err != nil {
		log.Warn("containerd: delete tasks before stop", zap.Error(err))
	}
	cancel()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(d.cfg.StopGrace)
	select {
	case <-d.exited:
	case <-t.C:
		log.Warn("containerd ignored SIGTERM; killing it", zap.Int("pid", d.Pid()))
	case <-ctx.Done():
	}
	t.Stop()
	_ = d.cmd.Process.Kill()
	<-d.exited
	for _, pid := range KillShims(d.Address) {
		log.Warn("containerd: killed a leftover shim", zap.Int("pid", pid))
	}
	for _, ns := range d.cfg.Namespaces {
		errs = append(errs, RemoveCgroups(ns))
		// runc's state root for the namespace, which the shim leaves
		// behind empty (not there when it holds anything).
		_ = os.Remove(filepath.Join("/run/containerd/runc", ns))
	}
	errs = append(errs, UnmountUnder(d.Dir))
	if d.runDir != "" {
		errs = append(errs, os.RemoveAll(d.runDir))
	}
	if err := errors.Join(errs...); err != nil {
		return &Error{Op: "stop", Dir: d.Dir, Err: err}
	}
	log.Info("containerd stopped", zap.Int("pid", d.Pid()))
	return nil
}

// Tail returns at most the last n bytes of a file, for failure messages.
func Tail(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return strings.TrimSpace(string(b))
}
