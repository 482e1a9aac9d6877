package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/adapters/gpuprobe"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_FactsWithoutGPU_Reported: an agent on this GPU-less
// machine, probing with the real GPU probe binary, states that it looked and
// found no driver; it measures the disk under containerd's root; and after a
// Run its facts list the image it ran as hot and the cache the Run wrote.
// The periodic report is set to an hour, so only the change-triggered
// reports (image ensured, workload exited) can carry those.
func TestAcceptance_FactsWithoutGPU_Reported(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	dataDir := tempDir(t)
	probe := testenv.BuildGPUProbe(t)
	f.startConfiguredAgent("facts-node", w, dataDir, func(c *agent.Config) {
		c.ContentRoot = w.ctrd.Root
		c.Accelerator = gpuprobe.NewExec(gpuprobe.ExecConfig{Path: probe, Log: f.log.Named("gpu")})
		c.AcceleratorTimeout = gpuprobe.DefaultTimeout
		c.FactsInterval = time.Hour
	})

	enrolled := f.nodeRecord("facts-node").Facts
	if enrolled == nil {
		t.Fatal("node record holds no facts after enrollment")
	}
	if a := enrolled.Host.Accelerator; !a.Established || a.Vendor != "" || len(a.Devices) != 0 {
		t.Fatalf("accelerator %+v, want established with no vendor (looked, found no driver)", a)
	}
	if d := enrolled.Host.Disk; !d.Known || d.TotalBytes <= 0 || d.FreeBytes <= 0 || d.FreeBytes > d.TotalBytes {
		t.Fatalf("disk %+v, want known with 0 < free <= total for containerd's root", d)
	}
	if h := enrolled.Host; h.ContainerRuntime != "containerd" || h.RuntimeVersion == "" || h.CPUMillis <= 0 || h.MemoryBytes <= 0 {
		t.Fatalf("host facts %+v", h)
	}

	id := f.submit(schemas.RunRequest{RequestID: "facts-run", Image: w.image.Reference,
		Command: []string{"sh", "-c", "echo cached > /cache/out"},
		Caches:  []schemas.CacheMount{{Name: "scratch", CompatibilityKey: "v1", Path: "/cache"}}})
	f.waitPhase(id, schemas.PhaseSucceeded, 60*time.Second)

	b, err := os.ReadFile(filepath.Join(dataDir, "caches", "scratch", "v1", "out"))
	if err != nil || string(b) != "cached\n" {
		t.Fatalf("cache on the host holds %q (err %v), want the Run's write", b, err)
	}

	var last *schemas.NodeFacts
	f.eventually(30*time.Second, "facts listing the image hot and the cache written", func() bool {
		last = f.nodeRecord("facts-node").Facts
		if last == nil {
			return false
		}
		hot, cached := false, false
		for _, im := range last.Images {
			hot = hot || (im.ManifestDigest == w.image.ManifestDigest && im.State == schemas.LocalityHot && im.ContentPresent &&
				len(im.LayerDigests) > 0 && len(im.LayerDiffIDs) == len(im.LayerDigests))
		}
		for _, c := range last.Caches {
			cached = cached || (c.Name == "scratch" && c.CompatibilityKey == "v1" && c.SizeBytes == int64(len("cached\n")) && !c.LastUsedAt.IsZero())
		}
		return hot && cached
	})
	if !last.Host.Accelerator.Established || !last.Host.Disk.Known {
		t.Fatalf("later facts lost what enrollment stated: %+v", last.Host)
	}
}

// startConfiguredAgent starts an agent like startAgent does, with the
// facts configuration startAgent does not expose, and waits for enrollment.
func (f *fleet) startConfiguredAgent(id string, w world, dataDir string, configure func(*agent.Config)) *agent.Agent {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rt, err := containerd.New(ctx, w.runtimeOptions(dataDir, f.log.Named(id)))
	if err != nil {
		cancel()
		f.t.Fatal(err)
	}
	conn, err := bus.Connect(f.nats.URL(), id, f.log.Named(id))
	if err != nil {
		cancel()
		_ = rt.Close()
		f.t.Fatal(err)
	}
	cfg := agent.Config{NodeID: id, Generation: 1, DataDir: dataDir, StopGrace: 2 * time.Second}
	configure(&cfg)
	a, err := agent.New(cfg, conn, rt, f.log.Named(id))
	if err != nil {
		cancel()
		conn.Close()
		_ = rt.Close()
		f.t.Fatal(err)
	}
	p := newPart(cancel, func() error {
		defer func() { conn.Close(); _ = rt.Close() }()
		return a.Run(ctx)
	})
	f.t.Cleanup(func() { p.stop(f.t) })
	f.waitNode(id, a)
	return a
}
