package containerd

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// fixture is shared by the subtests of TestRuntime: one containerd daemon
// and one imported image keep the suite fast on small machines.
type fixture struct {
	env      *testenv.Containerd
	imageDir string
	image    testenv.Image // imported and unpacked before subtests run
	rt       *Runtime
}

// TestRuntime runs every adapter test against one real containerd.
func TestRuntime(t *testing.T) {
	start := time.Now()
	env := testenv.StartContainerd(t)
	t.Logf("containerd ready in %v", time.Since(start))
	f := &fixture{env: env, imageDir: t.TempDir()}
	f.image = testenv.BuildBusyboxImage(t, f.imageDir, "busybox")
	f.rt = f.newRuntime(t)
	if _, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{
		Reference: f.image.Reference, ManifestDigest: f.image.ManifestDigest, Unpack: true,
	}); err != nil {
		t.Fatalf("EnsureImage: %v", err)
	}

	t.Run("Info", f.testInfo)
	t.Run("SnapshotterOption", f.testSnapshotterOption)
	t.Run("EnsureImage", f.testEnsureImage)
	t.Run("RegistryAuth", f.testRegistryAuth)
	t.Run("Images", f.testImages)
	t.Run("ImageDisk", f.testImageDisk)
	t.Run("Platforms", f.testPlatforms)
	t.Run("Mounts", f.testMounts)
	t.Run("Workload", f.testWorkload)
	t.Run("Launch", f.testLaunch)
	t.Run("Output", f.testOutput)
	t.Run("Stop", f.testStop)
	t.Run("OOM", f.testOOM)
	t.Run("Restart", f.testRestart)
	t.Run("Network", f.testNetwork)
	t.Run("Limits", f.testLimits)
	t.Run("Devices", f.testDevices)
	t.Run("Confinement", f.testConfinement)
	t.Run("Secrets", f.testSecrets)
}

// newRuntime connects a fresh Runtime, closed when t ends; a second one
// stands in for a restarted agent.
func (f *fixture) newRuntime(t *testing.T) *Runtime {
	t.Helper()
	rt, err := New(testCtx(t), Options{
		Address:   f.env.Address,
		Namespace: f.env.Namespace,
		ImageDir:  f.imageDir,
		LogDir:    f.env.Dir + "/logs",
		StateDir:  f.env.Dir + "/state",
		Logger:    zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return rt
}

// testCtx bounds a test's calls so a hang fails instead of stalling CI.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (f *fixture) testInfo(t *testing.T) {
	t.Parallel()
	info, err := f.rt.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "containerd" || info.Version == "" {
		t.Fatalf("Info = %+v", info)
	}
	// The platform pulls and launches pick when a Run names none.
	if p := info.Platform; p.OS != runtime.GOOS || p.Architecture != runtime.GOARCH {
		t.Fatalf("Info platform %+v, want %s/%s", p, runtime.GOOS, runtime.GOARCH)
	}
	if f.rt.Snapshotter() == "" {
		t.Fatal("no snapshotter chosen")
	}
	t.Logf("%+v, snapshotter %s", info, f.rt.Snapshotter())
}

func (f *fixture) testSnapshotterOption(t *testing.T) {
	t.Parallel()
	opts := Options{Address: f.env.Address, Namespace: f.env.Namespace, LogDir: t.TempDir(), StateDir: t.TempDir(), Logger: zaptest.NewLogger(t)}
	opts.Snapshotter = "native"
	rt, err := New(testCtx(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if rt.Snapshotter() != "native" {
		t.Fatalf("snapshotter %s, want native", rt.Snapshotter())
	}
	opts.Snapshotter = "no-such-snapshotter"
	if rt, err := New(testCtx(t), opts); err == nil {
		rt.Close()
		t.Fatal("New accepted an unknown snapshotter")
	}
}

// launch starts a workload from the fixture image and removes it when t ends.
func (f *fixture) launch(t *testing.T, rt *Runtime, spec noderuntime.WorkloadSpec) noderuntime.WorkloadStatus {
	t.Helper()
	spec.ImageReference = f.image.Reference
	spec.ManifestDigest = f.image.ManifestDigest
	st, err := rt.Launch(testCtx(t), spec)
	if err != nil {
		t.Fatalf("Launch %s: %v", spec.ID, err)
	}
	t.Cleanup(func() {
		if err := f.rt.Remove(context.Background(), spec.ID); err != nil {
			t.Errorf("Remove %s: %v", spec.ID, err)
		}
	})
	return st
}

// wait waits for a workload and checks it exited.
func wait(t *testing.T, rt *Runtime, id string) noderuntime.WorkloadStatus {
	t.Helper()
	st, err := rt.Wait(testCtx(t), id)
	if err != nil {
		t.Fatalf("Wait %s: %v", id, err)
	}
	if st.State != noderuntime.WorkloadExited {
		t.Fatalf("Wait %s: state %s, want exited", id, st.State)
	}
	return st
}

func requireIs(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want one matching %q", err, target)
	}
}
