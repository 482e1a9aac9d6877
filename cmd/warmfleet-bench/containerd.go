package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd"
)

// benchContainerd is a private containerd daemon the e2e bench starts the
// way scripts/run-local.sh and internal/testenv do: its own root, state and
// socket under one short temp dir, the CRI plugin off.
type benchContainerd struct {
	Dir, Address, Root, Namespace string
	cmd                           *exec.Cmd
	exited                        chan struct{}
}

func startContainerd() (*benchContainerd, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("e2e needs root: containerd runs containers")
	}
	for _, b := range []string{"containerd", "runc", "containerd-shim-runc-v2"} {
		if _, err := exec.LookPath(b); err != nil {
			return nil, fmt.Errorf("%s not found on PATH (apt-get install -y containerd runc)", b)
		}
	}
	// Unix socket paths must stay under 108 bytes: a short dir under /tmp.
	dir, err := os.MkdirTemp("/tmp", "wfbc")
	if err != nil {
		return nil, err
	}
	c := &benchContainerd{Dir: dir, Address: filepath.Join(dir, "c.sock"), Root: filepath.Join(dir, "root"),
		Namespace: filepath.Base(dir), exited: make(chan struct{})}
	cfg := fmt.Sprintf(`version = 2
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
`, c.Root, filepath.Join(dir, "state"), c.Address)
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	c.cmd = exec.Command("containerd", "--config", filepath.Join(dir, "config.toml"))
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		logf.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	go func() { _ = c.cmd.Wait(); logf.Close(); close(c.exited) }()
	if err := c.waitReady(20 * time.Second); err != nil {
		c.stop()
		return nil, fmt.Errorf("containerd not ready: %w (log %s)", err, filepath.Join(dir, "containerd.log"))
	}
	return c, nil
}

func (c *benchContainerd) waitReady(timeout time.Duration) error {
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
			return fmt.Errorf("socket %s not accepting after %s", c.Address, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	client, err := ctrd.New(c.Address, ctrd.WithTimeout(time.Until(deadline)))
	if err != nil {
		return err
	}
	defer client.Close()
	_, err = client.Version(ctx)
	return err
}

// stop ends the daemon, then whatever outlived it (shims, cgroups of this
// daemon's namespaces, mounts under Dir), then removes Dir.
func (c *benchContainerd) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
	c.killShims()
	for _, ns := range []string{c.Namespace, c.Namespace + "-direct"} {
		removeCgroups(ns)
	}
	unmountUnder(c.Dir)
	_ = os.RemoveAll(c.Dir)
}

// killShims kills shims serving this daemon, recognised by -address.
func (c *benchContainerd) killShims() {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == c.Address {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
		}
	}
}

// removeCgroups removes /<ns>/* cgroups runc made (v1 and v2 layouts).
func removeCgroups(ns string) {
	roots := []string{"/sys/fs/cgroup"}
	if entries, err := os.ReadDir("/sys/fs/cgroup"); err == nil {
		for _, e := range entries {
			if e.IsDir() {
				roots = append(roots, filepath.Join("/sys/fs/cgroup", e.Name()))
			}
		}
	}
	for _, root := range roots {
		nsDir := filepath.Join(root, ns)
		children, err := os.ReadDir(nsDir)
		if err != nil {
			continue
		}
		for _, ch := range children {
			if ch.IsDir() {
				_ = syscall.Rmdir(filepath.Join(nsDir, ch.Name()))
			}
		}
		_ = syscall.Rmdir(nsDir)
	}
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(dir string) {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, mp := range points {
		_ = syscall.Unmount(mp, syscall.MNT_DETACH)
	}
}
