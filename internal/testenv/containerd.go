package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/internal/ctrdproc"
)

// installHint tells a developer how to get what StartContainerd needs.
const installHint = "containerd/runc not installed: apt-get install -y containerd runc"

// Containerd is a private containerd daemon owned by one test.
type Containerd struct {
	// Address is the daemon's gRPC unix socket.
	Address string
	// Root is the daemon's persistent root directory.
	Root string
	// State is the daemon's runtime state directory.
	State string
	// Dir is the temporary directory holding everything of this daemon.
	Dir string
	// Namespace is unique to this daemon. Use it rather than a fixed name:
	// runc puts containers in cgroups named /<namespace>/<id>, which are
	// host-global, so two daemons of parallel test packages must not share
	// a namespace.
	Namespace string
	// LogPath is the daemon's own log, shown when the test fails.
	LogPath string

	d *ctrdproc.Daemon
}

// ContainerdOption tunes StartContainerd.
type ContainerdOption func(*containerdOptions)

type containerdOptions struct {
	diskBytes int64
}

// WithDiskSize puts the daemon's whole directory (Dir: root, state, and
// whatever the test adds there) on a tmpfs of that many bytes, so a test
// controls the filesystem's size and use exactly (disk watermarks).
func WithDiskSize(bytes int64) ContainerdOption {
	return func(o *containerdOptions) { o.diskBytes = bytes }
}

// StartContainerd starts a containerd daemon (internal/ctrdproc) with its
// own root, state and socket, waits until it answers, and stops it (with
// every task it ran, leftover shims, its namespace's cgroups and mounts)
// and removes its directory when t ends. It skips t when containerd, runc
// or root privileges are missing, and fails t instead when CI is set.
func StartContainerd(t testing.TB, opts ...ContainerdOption) *Containerd {
	t.Helper()
	requireRoot(t)
	requireBinaries(t, installHint, ctrdproc.Binaries...)
	var o containerdOptions
	for _, opt := range opts {
		opt(&o)
	}

	// Not t.TempDir: unix socket paths must stay under 108 bytes and test
	// names make t.TempDir paths long.
	dir, err := os.MkdirTemp("/tmp", "wfctrd")
	if err != nil {
		t.Fatalf("testenv: temp dir: %v", err)
	}
	unmount := func() {}
	if o.diskBytes > 0 {
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(o.diskBytes, 10)+",mode=0711"); err != nil {
			_ = os.RemoveAll(dir)
			t.Fatalf("testenv: mount a %d-byte tmpfs on %s: %v", o.diskBytes, dir, err)
		}
		unmount = func() {
			if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
				t.Logf("testenv: unmount %s: %v", dir, err)
			}
		}
	}
	ns := filepath.Base(dir)
	d, err := ctrdproc.Start(context.Background(), ctrdproc.Config{Dir: dir, Namespaces: []string{ns}, ReadyTimeout: 60 * time.Second,
		KillWithParent: true, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	if err != nil {
		unmount()
		_ = os.RemoveAll(dir)
		t.Fatalf("testenv: %v", err)
	}
	c := &Containerd{Address: d.Address, Root: d.Root, State: d.State, Dir: dir, Namespace: ns, LogPath: d.LogPath, d: d}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log (%s):\n%s", c.LogPath, ctrdproc.Tail(c.LogPath, 4000))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			t.Logf("testenv: %v", err)
		}
		unmount()
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("testenv: remove %s: %v", dir, err)
		}
	})
	return c
}
