package containerd

import (
	"context"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/containerd/errdefs"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/adapters/cdispec"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// listDevices prints the container's NVIDIA device nodes, its
// NVIDIA_VISIBLE_DEVICES, and whether the cgroup lets it write each node.
const listDevices = `for d in /dev/nvidia*; do [ -e "$d" ] || continue; echo "node $d"; echo x > "$d" && echo "writable $d"; done; echo "visible=$NVIDIA_VISIBLE_DEVICES spec=$WARMFLEET_CDI_SPEC"`

// testDevices gives workloads CDI devices from a spec in a temp dir: two
// fake GPUs backed by character devices with /dev/null's numbers, and a
// malformed spec beside them that must not get in the way.
//
// It is not parallel on purpose: run beside the Workload subtests, the
// HostGlibcImage step (building and importing an image) made
// Workload/ExitCodeTimesLogsLimits find its stderr line missing from the
// shim-written log about one run in three on a loaded 2-core machine. The
// cause is not found yet; run alone, before the parallel subtests resume,
// neither fails.
func (f *fixture) testDevices(t *testing.T) {
	gpus := testenv.WriteCDIGPUs(t)
	testenv.WriteMalformedCDISpec(t, gpus.Dir)
	rt, err := New(testCtx(t), Options{Address: f.env.Address, Namespace: f.env.Namespace, ImageDir: f.imageDir,
		LogDir: f.env.Dir + "/devlogs", Logger: zaptest.NewLogger(t), CDISpecDirs: []string{gpus.Dir}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close() })

	run := func(t *testing.T, id string, devices ...string) (noderuntime.WorkloadStatus, string) {
		launched := f.launch(t, rt, noderuntime.WorkloadSpec{ID: id, Command: []string{"sh", "-c", listDevices}, Devices: devices})
		if !reflect.DeepEqual(launched.Devices, devices) {
			t.Errorf("Launch reports devices %v, want %v", launched.Devices, devices)
		}
		st := wait(t, rt, id)
		if st.ExitCode != 0 {
			t.Fatalf("%s exited %d", id, st.ExitCode)
		}
		log, err := finishedOutput(t, rt, id)
		if err != nil {
			t.Fatal(err)
		}
		return st, string(log)
	}

	t.Run("OneDevice", func(t *testing.T) {
		st, log := run(t, "gpu-one", gpus.ByUUID(1))
		want := "node /dev/nvidia1\nwritable /dev/nvidia1\nvisible=1 spec=fake-gpus\n"
		if log != want {
			t.Fatalf("the workload saw\n%s\nwant\n%s", log, want)
		}
		if !reflect.DeepEqual(st.Devices, []string{gpus.ByUUID(1)}) {
			t.Errorf("Wait reports devices %v", st.Devices)
		}
		// A restarted agent reads what the workload holds from containerd.
		again := f.newRuntime(t)
		list, err := again.List(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, w := range list {
			found = found || (w.ID == "gpu-one" && reflect.DeepEqual(w.Devices, []string{gpus.ByUUID(1)}))
		}
		if !found {
			t.Errorf("after a restart, List = %+v, want gpu-one holding %s", list, gpus.ByUUID(1))
		}
	})

	t.Run("BothDevices", func(t *testing.T) {
		_, log := run(t, "gpu-both", gpus.ByIndex(0), gpus.ByIndex(1))
		for _, want := range []string{"node /dev/nvidia0\n", "writable /dev/nvidia0\n", "node /dev/nvidia1\n", "writable /dev/nvidia1\n", "spec=fake-gpus"} {
			if !strings.Contains(log, want) {
				t.Errorf("the workload saw\n%s\nlacking %q", log, want)
			}
		}
	})

	t.Run("NoDevices", func(t *testing.T) {
		_, log := run(t, "gpu-none")
		if log != "visible= spec=\n" {
			t.Fatalf("a workload given no devices saw\n%s", log)
		}
	})

	t.Run("HostGlibcImage", func(t *testing.T) {
		// The image a GPU Run uses for programs its CDI spec mounts from
		// the host (nvidia-smi needs glibc): the host's own shell and libc.
		img := testenv.BuildHostImage(t, f.imageDir, "hostlibc")
		if _, err := rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: img.Reference, ManifestDigest: img.ManifestDigest, Unpack: true}); err != nil {
			t.Fatal(err)
		}
		_, err := rt.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: "gpu-hostlibc", ImageReference: img.Reference, ManifestDigest: img.ManifestDigest,
			Command: []string{"/bin/sh", "-c", `[ -c /dev/nvidia0 ] && echo "card $NVIDIA_VISIBLE_DEVICES"`}, Devices: []string{gpus.ByIndex(0)}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Remove(context.Background(), "gpu-hostlibc") })
		if st := wait(t, rt, "gpu-hostlibc"); st.ExitCode != 0 {
			log, _ := finishedOutput(t, rt, "gpu-hostlibc")
			t.Fatalf("exit %d: %s", st.ExitCode, log)
		}
		if log, _ := finishedOutput(t, rt, "gpu-hostlibc"); string(log) != "card 0\n" {
			t.Fatalf("the host-glibc workload said %q", log)
		}
	})

	t.Run("UnknownDeviceFailsLaunch", func(t *testing.T) {
		for id, devices := range map[string][]string{
			"gpu-unknown": {gpus.ByIndex(0), "nvidia.com/gpu=7"},
			"gpu-badname": {"gpu0"},
			"gpu-comma":   {"nvidia.com/gpu=0,1"},
		} {
			_, err := rt.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: id, ImageReference: f.image.Reference,
				ManifestDigest: f.image.ManifestDigest, Command: []string{"true"}, Devices: devices})
			if !errors.Is(err, noderuntime.ErrDeviceUnavailable) {
				t.Fatalf("Launch %v = %v, want ErrDeviceUnavailable", devices, err)
			}
			t.Logf("%s: %v", id, err)
			ctx := rt.ctx(testCtx(t))
			if _, err := rt.client.LoadContainer(ctx, id); !errdefs.IsNotFound(err) {
				t.Errorf("a refused launch left container %s (%v)", id, err)
			}
			if _, err := rt.client.SnapshotService(rt.snapshotter).Stat(ctx, id); !errdefs.IsNotFound(err) {
				t.Errorf("a refused launch left snapshot %s (%v)", id, err)
			}
		}
		_, err := rt.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: "gpu-unknown", ImageReference: f.image.Reference,
			ManifestDigest: f.image.ManifestDigest, Devices: []string{"nvidia.com/gpu=7"}})
		if !errors.Is(err, cdispec.ErrUnresolvable) || !strings.Contains(err.Error(), "broken.yaml") {
			t.Errorf("error %v does not say the device is undeclared and which spec was broken", err)
		}
	})

	t.Run("VanishedNodeFailsLaunch", func(t *testing.T) {
		// The spec names the device, but its node is gone from the host:
		// the edits fail, nothing is created.
		gone := testenv.WriteCDIGPUs(t)
		if err := os.Remove(gone.HostNodes[0]); err != nil {
			t.Fatal(err)
		}
		rt2, err := New(testCtx(t), Options{Address: f.env.Address, Namespace: f.env.Namespace, LogDir: f.env.Dir + "/devlogs2",
			Logger: zaptest.NewLogger(t), CDISpecDirs: []string{gone.Dir}})
		if err != nil {
			t.Fatal(err)
		}
		defer rt2.Close()
		_, err = rt2.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: "gpu-gone", ImageReference: f.image.Reference,
			ManifestDigest: f.image.ManifestDigest, Devices: []string{gone.ByIndex(0)}})
		if !errors.Is(err, noderuntime.ErrDeviceUnavailable) || !errors.Is(err, cdispec.ErrInject) {
			t.Fatalf("Launch with a vanished node = %v", err)
		}
		if _, err := rt2.client.SnapshotService(rt2.snapshotter).Stat(rt2.ctx(testCtx(t)), "gpu-gone"); !errdefs.IsNotFound(err) {
			t.Errorf("snapshot left (%v)", err)
		}
	})
}
