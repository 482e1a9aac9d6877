package containerd

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/oci"

	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/noderuntime"
)

func (f *fixture) testWorkload(t *testing.T) {
	t.Run("ExitCodeTimesLogsLimits", func(t *testing.T) {
		t.Parallel()
		before := time.Now()
		launched := f.launch(t, f.rt, noderuntime.WorkloadSpec{
			ID:          "exit3",
			Command:     []string{"sh", "-c", `echo "out $GREETING"; echo err >&2; exit 3`},
			Env:         []string{"GREETING=hello"},
			CPUMillis:   500,
			MemoryBytes: 64 << 20,
			Labels:      map[string]string{"run": "r1"},
		})
		if launched.State != noderuntime.WorkloadRunning || launched.StartedAt.Before(before) {
			t.Fatalf("Launch = %+v", launched)
		}
		st := wait(t, f.rt, "exit3")
		if st.ExitCode != 3 || st.OOMKilled {
			t.Fatalf("Wait = %+v, want exit 3 without OOM", st)
		}
		// Launch takes the time after Start returns; a fast exit may come
		// before that, and then the start is reported as the exit time.
		if st.StartedAt.Before(before) || st.StartedAt.After(launched.StartedAt) {
			t.Errorf("StartedAt %v, want between %v and Launch's %v", st.StartedAt, before, launched.StartedAt)
		}
		if st.FinishedAt.Before(st.StartedAt) || time.Since(st.FinishedAt) > time.Minute {
			t.Errorf("FinishedAt %v, StartedAt %v", st.FinishedAt, st.StartedAt)
		}
		if len(st.Labels) != 1 || st.Labels["run"] != "r1" {
			t.Errorf("Labels %v, want only the caller's", st.Labels)
		}
		if err := f.rt.Finish(testCtx(t), "exit3"); err != nil {
			t.Fatal(err)
		}
		dir := f.rt.OutputDir("exit3")
		stdout, _ := os.ReadFile(nodelog.DataPath(dir, nodelog.Stdout))
		stderr, _ := os.ReadFile(nodelog.DataPath(dir, nodelog.Stderr))
		if string(stdout) != "out hello\n" || string(stderr) != "err\n" || !nodelog.Done(dir) {
			t.Errorf("stdout %q, stderr %q, done %v: want each stream in its own file, complete", stdout, stderr, nodelog.Done(dir))
		}
		ctx := f.rt.ctx(testCtx(t))
		c, err := f.rt.client.LoadContainer(ctx, "exit3")
		if err != nil {
			t.Fatal(err)
		}
		spec, err := c.Spec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res := spec.Linux.Resources
		if res.CPU == nil || *res.CPU.Quota != 50_000 || *res.CPU.Period != 100_000 {
			t.Errorf("cpu limits %+v, want 50ms per 100ms", res.CPU)
		}
		if res.Memory == nil || *res.Memory.Limit != 64<<20 {
			t.Errorf("memory limits %+v", res.Memory)
		}
		again, err := f.rt.Inspect(testCtx(t), "exit3")
		if err != nil || again.State != noderuntime.WorkloadExited || again.ExitCode != 3 {
			t.Errorf("Inspect = %+v, %v", again, err)
		}
	})

	t.Run("LaunchTwice", func(t *testing.T) {
		t.Parallel()
		f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: "twice", Command: []string{"sleep", "300"}})
		_, err := f.rt.Launch(testCtx(t), noderuntime.WorkloadSpec{
			ID: "twice", ImageReference: f.image.Reference, ManifestDigest: f.image.ManifestDigest,
			Command: []string{"true"},
		})
		requireIs(t, err, noderuntime.ErrWorkloadExists)
		st, err := f.rt.Inspect(testCtx(t), "twice")
		if err != nil || st.State != noderuntime.WorkloadRunning {
			t.Fatalf("after refused relaunch: %+v, %v; want the first still running", st, err)
		}
		list, err := f.rt.List(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, w := range list {
			found = found || (w.ID == "twice" && w.State == noderuntime.WorkloadRunning)
		}
		if !found {
			t.Fatalf("List = %+v, want twice running", list)
		}
	})

	t.Run("ImageNotEnsured", func(t *testing.T) {
		t.Parallel()
		_, err := f.rt.Launch(testCtx(t), noderuntime.WorkloadSpec{
			ID: "noimage", ImageReference: "localhost/x@sha256:" + strings.Repeat("0", 64),
			ManifestDigest: "sha256:" + strings.Repeat("0", 64),
		})
		requireIs(t, err, noderuntime.ErrImageNotFound)
		_, err = f.rt.Inspect(testCtx(t), "noimage")
		requireIs(t, err, noderuntime.ErrWorkloadNotFound)
	})

	t.Run("MissingWorkload", func(t *testing.T) {
		t.Parallel()
		ctx := testCtx(t)
		_, err := f.rt.Inspect(ctx, "absent")
		requireIs(t, err, noderuntime.ErrWorkloadNotFound)
		_, err = f.rt.Wait(ctx, "absent")
		requireIs(t, err, noderuntime.ErrWorkloadNotFound)
		requireIs(t, f.rt.Stop(ctx, "absent", time.Second), noderuntime.ErrWorkloadNotFound)
		if err := f.rt.Remove(ctx, "absent"); err != nil {
			t.Fatalf("Remove of a missing workload: %v", err)
		}
	})

	t.Run("TaskGone", func(t *testing.T) {
		t.Parallel()
		f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: "gone", Command: []string{"sh", "-c", "exit 4"}})
		wait(t, f.rt, "gone")
		// What a reboot does: the task vanishes, the container stays.
		ctx := f.rt.ctx(testCtx(t))
		deleteTask(t, ctx, f.rt.client, "gone")
		st, err := f.rt.Inspect(ctx, "gone")
		if err != nil || st.State != noderuntime.WorkloadExited || st.ExitCode != 4 || st.StartedAt.IsZero() || st.FinishedAt.IsZero() {
			t.Fatalf("Inspect after task deletion = %+v, %v; want the recorded exit 4", st, err)
		}
		if st, err := f.rt.Wait(ctx, "gone"); err != nil || st.ExitCode != 4 {
			t.Fatalf("Wait after task deletion = %+v, %v", st, err)
		}

		// A container whose task never started (nor left a record).
		if _, err := f.rt.client.NewContainer(ctx, "neverstarted",
			ctrd.WithContainerLabels(map[string]string{labelManaged: "true"}),
			ctrd.WithRuntime(runcRuntime, nil),
			ctrd.WithNewSpec(oci.WithProcessArgs("true"))); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.rt.Remove(context.Background(), "neverstarted") })
		if st, err := f.rt.Wait(ctx, "neverstarted"); err != nil || st.State != noderuntime.WorkloadUnknown || !st.StartedAt.IsZero() {
			t.Fatalf("Wait on never-started = %+v, %v; want unknown", st, err)
		}
	})

	t.Run("RemoveCleansUp", func(t *testing.T) {
		t.Parallel()
		ctx := f.rt.ctx(testCtx(t))
		f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: "removed", Command: []string{"sleep", "300"}})
		if err := f.rt.Remove(ctx, "removed"); err != nil {
			t.Fatal(err)
		}
		_, err := f.rt.Inspect(ctx, "removed")
		requireIs(t, err, noderuntime.ErrWorkloadNotFound)
		if _, err := f.rt.client.SnapshotService(f.rt.Snapshotter()).Stat(ctx, "removed"); !errdefs.IsNotFound(err) {
			t.Errorf("snapshot survived Remove (err %v)", err)
		}
		if _, err := os.Stat(f.rt.OutputDir("removed")); !os.IsNotExist(err) {
			t.Errorf("log survived Remove (err %v)", err)
		}
		list, err := f.rt.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range list {
			if w.ID == "removed" {
				t.Errorf("List still shows %+v", w)
			}
		}
	})
}

// deleteTask removes a workload's task behind the adapter's back.
func deleteTask(t *testing.T, ctx context.Context, client *ctrd.Client, id string) {
	t.Helper()
	c, err := client.LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := task.Delete(ctx); err != nil {
		t.Fatal(err)
	}
}
