package containerd

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// TestRealGPU_NvidiaSmiSeesTheInjectedCard runs on a host with an NVIDIA
// card and a CDI spec for it (scripts/gpu-smoke.sh sets it up and runs it):
// WARMFLEET_GPU_CDI_DIR is the spec directory, WARMFLEET_GPU_UUID the
// card's UUID (from warmfleet-gpu-probe), WARMFLEET_GPU_NVIDIA_SMI the
// host's nvidia-smi (its libraries go into the image). A workload given the
// card by UUID, and one given it by index, see exactly that card; one given
// nothing sees none. Elsewhere it skips.
func TestRealGPU_NvidiaSmiSeesTheInjectedCard(t *testing.T) {
	cdiDir, uuid := os.Getenv("WARMFLEET_GPU_CDI_DIR"), os.Getenv("WARMFLEET_GPU_UUID")
	if cdiDir == "" {
		t.Skip("WARMFLEET_GPU_CDI_DIR unset: no GPU host to test on")
	}
	if uuid == "" {
		t.Fatal("WARMFLEET_GPU_CDI_DIR set without WARMFLEET_GPU_UUID")
	}
	smi := os.Getenv("WARMFLEET_GPU_NVIDIA_SMI")
	if smi == "" {
		var err error
		if smi, err = exec.LookPath("nvidia-smi"); err != nil {
			t.Fatal("no nvidia-smi on PATH; set WARMFLEET_GPU_NVIDIA_SMI")
		}
	}
	env := testenv.StartContainerd(t)
	imageDir := t.TempDir()
	img := testenv.BuildHostImage(t, imageDir, "nvidia-smi", smi)
	rt, err := New(testCtx(t), Options{Address: env.Address, Namespace: env.Namespace, ImageDir: imageDir,
		LogDir: env.Dir + "/logs", Logger: zaptest.NewLogger(t), CDISpecDirs: []string{cdiDir}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if _, err := rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: img.Reference, ManifestDigest: img.ManifestDigest, Unpack: true}); err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, id string, devices ...string) (int, string) {
		t.Helper()
		_, err := rt.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: id, ImageReference: img.Reference, ManifestDigest: img.ManifestDigest,
			Command: []string{"/bin/sh", "-c", "nvidia-smi -L"}, Devices: devices,
			Env: []string{"PATH=/usr/local/nvidia/bin:/usr/local/bin:/usr/bin:/bin", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu"}})
		if err != nil {
			t.Fatalf("Launch %s with %v: %v", id, devices, err)
		}
		t.Cleanup(func() { _ = rt.Remove(context.Background(), id) })
		st := wait(t, rt, id)
		log, _ := finishedOutput(t, rt, id)
		t.Logf("%s (devices %v) exit %d:\n%s", id, devices, st.ExitCode, log)
		return st.ExitCode, string(log)
	}
	for id, device := range map[string]string{"smi-uuid": "nvidia.com/gpu=" + uuid, "smi-index": "nvidia.com/gpu=0"} {
		t.Run(id, func(t *testing.T) {
			code, out := run(t, id, device)
			if code != 0 || strings.Count(out, "GPU ") != 1 || !strings.Contains(out, "(UUID: "+uuid+")") {
				t.Fatalf("nvidia-smi -L given %s: exit %d\n%s\nwant exactly the card %s", device, code, out, uuid)
			}
		})
	}
	t.Run("smi-none", func(t *testing.T) {
		if code, out := run(t, "smi-none"); code == 0 && strings.Contains(out, uuid) {
			t.Fatalf("a workload given no device sees the card:\n%s", out)
		}
	})
}
