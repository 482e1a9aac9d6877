package containerd

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/errdefs"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// testLaunch checks a launch's one failure path: whatever steps it took,
// undo leaves nothing of them behind, and the id launches again.
func (f *fixture) testLaunch(t *testing.T) {
	// gone fails t if anything of workload id is left on nr.
	gone := func(t *testing.T, nr *netRuntime, id string) {
		t.Helper()
		ctx := nr.ctx(testCtx(t))
		if _, err := nr.Inspect(ctx, id); !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
			t.Errorf("container %s left (Inspect: %v)", id, err)
		}
		if _, err := nr.client.SnapshotService(nr.Snapshotter()).Stat(ctx, id); !errdefs.IsNotFound(err) {
			t.Errorf("snapshot %s left (Stat: %v)", id, err)
		}
		nr.nothingLeft(t)
	}

	t.Run("UndoAfterEachStep", func(t *testing.T) {
		t.Parallel()
		nr := f.newNetRuntime(t)
		spec := noderuntime.WorkloadSpec{ID: "undo", Network: noderuntime.NetworkBridge, Command: []string{"sleep", "300"},
			ImageReference: f.image.Reference, ManifestDigest: f.image.ManifestDigest}
		// The steps of run that create something, in its order.
		creating := []struct {
			name string
			do   func(ctx context.Context, l *launching) error
		}{
			{"network", func(ctx context.Context, l *launching) (err error) {
				l.attached, err = l.w.net.attach(ctx, l.spec.ID, l.spec.Network)
				return err
			}},
			{"container", func(ctx context.Context, l *launching) error {
				opts, err := l.checkedOpts()
				if err != nil {
					return err
				}
				return l.createContainer(ctx, opts)
			}},
			{"task", func(ctx context.Context, l *launching) (err error) {
				l.task, err = l.container.NewTask(ctx, l.w.output.io(l.spec))
				return err
			}},
			{"start", func(ctx context.Context, l *launching) error {
				if err := l.attached.wait(); err != nil {
					return err
				}
				return l.task.Start(ctx)
			}},
		}
		for n := 1; n <= len(creating); n++ {
			ctx := nr.ctx(testCtx(t))
			l := &launching{w: nr.workloads, spec: spec, steps: newLaunchSteps()}
			var err error
			if l.img, err = nr.images.forLaunch(ctx, spec); err != nil {
				t.Fatal(err)
			}
			for _, c := range creating[:n] {
				if err := c.do(ctx, l); err != nil {
					t.Fatalf("step %s: %v", c.name, err)
				}
			}
			l.undo(ctx)
			t.Logf("undone after %s", creating[n-1].name)
			gone(t, nr, spec.ID)
		}
		f.launchOn(t, nr.Runtime, spec)
	})

	t.Run("StraySnapshotRemoved", func(t *testing.T) {
		t.Parallel()
		ctx := f.rt.ctx(testCtx(t))
		sn := f.rt.client.SnapshotService(f.rt.Snapshotter())
		if _, err := sn.Prepare(ctx, "undo-stray", ""); err != nil {
			t.Fatal(err)
		}
		l := &launching{w: f.rt.workloads, spec: noderuntime.WorkloadSpec{ID: "undo-stray"}, straySnapshot: true}
		l.undo(ctx)
		if _, err := sn.Stat(ctx, "undo-stray"); !errdefs.IsNotFound(err) {
			t.Errorf("undo left the snapshot container creation made (Stat: %v)", err)
		}
	})

	t.Run("FailedTaskLeavesNothing", func(t *testing.T) {
		t.Parallel()
		nr := f.newNetRuntime(t)
		spec := noderuntime.WorkloadSpec{ID: "undo-task", Network: noderuntime.NetworkBridge, Command: []string{"/no/such/program"},
			ImageReference: f.image.Reference, ManifestDigest: f.image.ManifestDigest}
		_, err := nr.Launch(testCtx(t), spec)
		if err == nil || !strings.Contains(err.Error(), "launch undo-task: ") {
			t.Fatalf("Launch of a program the image lacks: %v, want a failed launch", err)
		}
		t.Logf("%v", err)
		gone(t, nr, spec.ID)
		spec.Command = []string{"true"}
		f.launchOn(t, nr.Runtime, spec)
		if st := wait(t, nr.Runtime, spec.ID); st.ExitCode != 0 {
			t.Fatalf("relaunch exited %d", st.ExitCode)
		}
	})
}

func TestCheckLaunchSpec(t *testing.T) {
	if err := checkLaunchSpec(noderuntime.WorkloadSpec{ID: "w", Labels: map[string]string{"run": "r1"}}); err != nil {
		t.Errorf("a plain spec refused: %v", err)
	}
	if err := checkLaunchSpec(noderuntime.WorkloadSpec{}); err == nil {
		t.Error("an empty id accepted")
	}
	err := checkLaunchSpec(noderuntime.WorkloadSpec{ID: "w", Labels: map[string]string{labelManaged: "false"}})
	if err == nil || !strings.Contains(err.Error(), labelPrefix) {
		t.Errorf("a label in the adapter's prefix: %v, want it refused naming the prefix", err)
	}
}

func TestLaunchLabels(t *testing.T) {
	spec := noderuntime.WorkloadSpec{ID: "w", Labels: map[string]string{"run": "r1"}}
	got := launchLabels(spec, "sha256:abc")
	want := map[string]string{"run": "r1", labelManaged: "true", labelImageDigest: "sha256:abc", labelOwnOutput: "true"}
	if !maps.Equal(got, want) {
		t.Errorf("labels %v, want %v", got, want)
	}
	if !maps.Equal(userLabels(got), spec.Labels) {
		t.Errorf("user labels %v, want the caller's %v", userLabels(got), spec.Labels)
	}
	spec.Output.Dir = "/elsewhere"
	spec.Devices = []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}
	got = launchLabels(spec, "sha256:abc")
	if _, own := got[labelOwnOutput]; own {
		t.Error("a workload with its own output dir is marked as using the runtime's")
	}
	if d := labelledDevices(got); !slices.Equal(d, spec.Devices) {
		t.Errorf("devices read back %v, want %v", d, spec.Devices)
	}
}

// TestOutputs: a workload naming no output dir gets one of the runtime's,
// cleared before its launch and removed with it; a dir the spec names is
// the caller's and never touched.
func TestOutputs(t *testing.T) {
	o := outputs{dir: t.TempDir(), writer: "/bin/true", log: zap.NewNop()}
	own := o.dirOf("w")
	if filepath.Dir(own) != o.dir {
		t.Fatalf("dirOf = %s, want under %s", own, o.dir)
	}
	theirs := t.TempDir()
	if err := os.MkdirAll(own, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{own, theirs} {
		if err := os.WriteFile(filepath.Join(d, "stale"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.clear(noderuntime.WorkloadSpec{ID: "w", Output: noderuntime.Output{Dir: theirs}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(theirs, "stale")); err != nil {
		t.Errorf("clear touched the spec's own dir: %v", err)
	}
	if err := o.clear(noderuntime.WorkloadSpec{ID: "w"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(own); !os.IsNotExist(err) {
		t.Errorf("clear left the runtime's dir of an earlier w (stat: %v)", err)
	}
	if err := os.MkdirAll(own, 0o700); err != nil {
		t.Fatal(err)
	}
	o.remove("w")
	if _, err := os.Stat(own); !os.IsNotExist(err) {
		t.Errorf("remove left %s (stat: %v)", own, err)
	}
}
