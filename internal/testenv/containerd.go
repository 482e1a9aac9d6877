package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
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

	cmd    *exec.Cmd
	exited chan struct{}
}

// StartContainerd starts a containerd daemon with its own root, state and
// socket, waits until it answers, and stops it (with every task it ran) when
// t ends. It skips t when containerd, runc or root privileges are missing,
// and fails t instead when CI is set.
func StartContainerd(t testing.TB) *Containerd {
	t.Helper()
	requireRoot(t)
	requireBinaries(t, installHint, "containerd", "runc", "containerd-shim-runc-v2")

	// Not t.TempDir: unix socket paths must stay under 108 bytes and test
	// names make t.TempDir paths long.
	dir, err := os.MkdirTemp("/tmp", "wfctd")
	if err != nil {
		t.Fatalf("testenv: temp dir: %v", err)
	}
	c := &Containerd{
		Address:   filepath.Join(dir, "c.sock"),
		Root:      filepath.Join(dir, "root"),
		State:     filepath.Join(dir, "state"),
		Dir:       dir,
		Namespace: filepath.Base(dir),
		LogPath:   filepath.Join(dir, "containerd.log"),
		exited:    make(chan struct{}),
	}
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(c.config()), 0o600); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("testenv: write containerd config: %v", err)
	}
	logFile, err := os.Create(c.LogPath)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("testenv: containerd log: %v", err)
	}
	c.cmd = exec.Command("containerd", "--config", cfgPath)
	c.cmd.Stdout = logFile
	c.cmd.Stderr = logFile
	// Kill the daemon if the test binary dies without running cleanups
	// (e.g. a test timeout panic), so it does not outlive the run.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		logFile.Close()
		os.RemoveAll(dir)
		t.Fatalf("testenv: start containerd: %v", err)
	}
	go func() {
		// Reaps the daemon; ends when the daemon does, which cleanup ensures.
		_ = c.cmd.Wait()
		logFile.Close()
		close(c.exited)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log (%s):\n%s", c.LogPath, tail(c.LogPath, 4000))
		}
		c.stop(t)
	})

	if err := c.waitReady(20 * time.Second); err != nil {
		t.Fatalf("testenv: containerd did not become ready: %v\nlog:\n%s", err, tail(c.LogPath, 4000))
	}
	return c
}

// config is the daemon's configuration. The CRI plugin is disabled (tests
// talk to containerd directly and CRI would need CNI), and so are plugins
// that only fail to load or write outside Dir.
func (c *Containerd) config() string {
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
`, c.Root, c.State, c.Address)
}

// waitReady polls the socket until the daemon answers a Version call.
func (c *Containerd) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-c.exited:
			return errors.New("containerd exited during startup")
		default:
		}
		if conn, err := net.DialTimeout("unix", c.Address, time.Second); err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("socket %s not accepting connections after %v", c.Address, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	client, err := containerd.New(c.Address, containerd.WithTimeout(time.Until(deadline)))
	if err != nil {
		return err
	}
	defer client.Close()
	_, err = client.Version(ctx)
	return err
}

// tail returns at most the last n bytes of a file, for failure messages.
func tail(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return strings.TrimSpace(string(b))
}
