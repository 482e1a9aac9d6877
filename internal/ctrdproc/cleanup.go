package ctrdproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/namespaces"
)

// DeleteAllTasks kills and deletes every task in every namespace of the
// daemon at address, unless exited is closed (a dead daemon has none to
// delete).
func DeleteAllTasks(ctx context.Context, address string, exited <-chan struct{}) error {
	select {
	case <-exited:
		return nil
	default:
	}
	client, err := containerd.New(address, containerd.WithTimeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer client.Close()
	nss, err := client.NamespaceService().List(ctx)
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	var errs []error
	for _, ns := range nss {
		nsctx := namespaces.WithNamespace(ctx, ns)
		resp, err := client.TaskService().List(nsctx, &tasks.ListTasksRequest{})
		if err != nil {
			errs = append(errs, fmt.Errorf("list tasks in %s: %w", ns, err))
			continue
		}
		for _, p := range resp.Tasks {
			if err := deleteTask(nsctx, client, p.ID); err != nil {
				errs = append(errs, fmt.Errorf("delete task %s/%s: %w", ns, p.ID, err))
			}
		}
	}
	return errors.Join(errs...)
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

// ShimPids lists the shims serving the daemon at address (shims outlive
// their daemon by design), recognised by their -address argument.
func ShimPids(address string) []int {
	return PidsWhere(func(args []string) bool {
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == address {
				return true
			}
		}
		return false
	})
}

// PidsWhere lists the processes whose command line (argv) satisfies match.
func PidsWhere(match func(args []string) bool) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if match(strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// KillShims kills the shims serving the daemon at address and returns
// their pids.
func KillShims(address string) []int {
	pids := ShimPids(address)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return pids
}

// RemoveCgroups kills processes left in cgroups /<ns>/* (cgroup v1 and v2)
// and removes those cgroups, which runc creates but only deletes with the
// task.
func RemoveCgroups(ns string) error {
	if ns == "" || strings.Contains(ns, "/") || ns == "." || ns == ".." {
		return fmt.Errorf("cgroups of namespace %q: not a namespace name", ns)
	}
	roots := []string{"/sys/fs/cgroup"}
	if entries, err := os.ReadDir("/sys/fs/cgroup"); err == nil {
		for _, e := range entries {
			if e.IsDir() {
				roots = append(roots, filepath.Join("/sys/fs/cgroup", e.Name()))
			}
		}
	}
	var errs []error
	for _, root := range roots {
		nsDir := filepath.Join(root, ns)
		children, err := os.ReadDir(nsDir)
		if err != nil {
			continue
		}
		for _, ch := range children {
			if ch.IsDir() {
				errs = append(errs, removeCgroup(filepath.Join(nsDir, ch.Name())))
			}
		}
		errs = append(errs, removeCgroup(nsDir))
	}
	return errors.Join(errs...)
}

func removeCgroup(dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
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

// UnmountUnder detaches every mount below dir, deepest first, so that a
// rootfs left mounted by a killed shim does not make a RemoveAll fail or
// delete through into a snapshot.
func UnmountUnder(dir string) error {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
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
	var errs []error
	for _, mp := range points {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
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
