package testenv

import (
	"context"
	"os"
	"path/filepath"
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

// StartContainerd starts a containerd daemon (internal/ctrdproc) with its
// own root, state and socket, waits until it answers, and stops it (with
// every task it ran, leftover shims, its namespace's cgroups and mounts)
// and removes its directory when t ends. It skips t when containerd, runc
// or root privileges are missing, and fails t instead when CI is set.
func StartContainerd(t testing.TB) *Containerd {
	t.Helper()
	requireRoot(t)
	requireBinaries(t, installHint, ctrdproc.Binaries...)

	// Not t.TempDir: unix socket paths must stay under 108 bytes and test
	// names make t.TempDir paths long.
	dir, err := os.MkdirTemp("/tmp", "wfctrd")
	if err != nil {
		t.Fatalf("testenv: temp dir: %v", err)
	}
	ns := filepath.Base(dir)
	d, err := ctrdproc.Start(context.Background(), ctrdproc.Config{Dir: dir, Namespaces: []string{ns}, ReadyTimeout: 20 * time.Second,
		KillWithParent: true, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	if err != nil {
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
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("testenv: remove %s: %v", dir, err)
		}
	})
	return c
}
