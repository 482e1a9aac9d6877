package testenv

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/namespaces"
)

// stop tears the daemon down so nothing outlives the test: tasks first (so
// their shims exit and unmount rootfs cleanly), then the daemon, then
// whatever a crash may have left behind (shims, cgroups, mounts), then Dir.
func (c *Containerd) stop(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.deleteAllTasks(ctx, t)
	c.stopDaemon(t)
	c.killShims(t)
	// Only our own namespace's cgroups: its name is unique to this daemon,
	// whereas a namespace like "default" may be shared with the host's
	// containerd and must not be touched.
	removeCgroups(t, c.Namespace)
	unmountUnder(t, c.Dir)
	if err := os.RemoveAll(c.Dir); err != nil {
		t.Logf("testenv: remove %s: %v", c.Dir, err)
	}
}

// deleteAllTasks kills and deletes every task in every namespace.
func (c *Containerd) deleteAllTasks(ctx context.Context, t testing.TB) {
	select {
	case <-c.exited:
		return
	default:
	}
	client, err := containerd.New(c.Address, containerd.WithTimeout(5*time.Second))
	if err != nil {
		t.Logf("testenv: connect for cleanup: %v", err)
		return
	}
	defer client.Close()
	nss, err := client.NamespaceService().List(ctx)
	if err != nil {
		t.Logf("testenv: list namespaces: %v", err)
		return
	}
	for _, ns := range nss {
		nsctx := namespaces.WithNamespace(ctx, ns)
		resp, err := client.TaskService().List(nsctx, &tasks.ListTasksRequest{})
		if err != nil {
			t.Logf("testenv: list tasks in %s: %v", ns, err)
			continue
		}
		for _, p := range resp.Tasks {
			if err := deleteTask(nsctx, client, p.ID); err != nil {
				t.Logf("testenv: delete task %s/%s: %v", ns, p.ID, err)
			}
		}
	}
}

func deleteTask(ctx context.Context, client *containerd.Client, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	container, err := client.LoadContainer(ctx, id)
	if err != nil {
		return err
	}
	task, err := container.Task(ctx, nil)
	if err != nil {
		return err
	}
	_, err = task.Delete(ctx, containerd.WithProcessKill)
	return err
}

// stopDaemon asks containerd to exit and kills it if it does not.
func (c *Containerd) stopDaemon(t testing.TB) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
		return
	case <-time.After(5 * time.Second):
	}
	t.Logf("testenv: containerd ignored SIGTERM, killing it")
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// killShims kills shims that still serve this daemon (shims outlive their
// daemon by design). They are recognised by their -address argument, which
// names this daemon's private socket.
func (c *Containerd) killShims(t testing.TB) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
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
				t.Logf("testenv: killing leftover shim %d", pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
		}
	}
}

// removeCgroups kills processes left in cgroups /<ns>/* (cgroup v1 and v2)
// and removes those cgroups, which runc creates but only deletes with the
// task.
func removeCgroups(t testing.TB, ns string) {
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
				removeCgroup(t, filepath.Join(nsDir, ch.Name()))
			}
		}
		removeCgroup(t, nsDir)
	}
}

func removeCgroup(t testing.TB, dir string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			t.Logf("testenv: remove cgroup %s: %v", dir, err)
			return
		}
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, f := range strings.Fields(string(procs)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unmountUnder detaches every mount below dir, deepest first, so that a
// rootfs left mounted by a killed shim does not make RemoveAll fail or
// delete through into a snapshot.
func unmountUnder(t testing.TB, dir string) {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(raw), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, mp := range points {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			t.Logf("testenv: unmount %s: %v", mp, err)
		}
	}
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for space, ...).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
