package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// stubRuntime answers facts questions; workload calls are not used here.
type stubRuntime struct {
	noderuntime.Runtime // nil: any other call panics, which a facts test must not make
	images              []schemas.ImageLocality
	err                 error
	platform            schemas.Platform
}

func (s stubRuntime) Info(context.Context) (noderuntime.RuntimeInfo, error) {
	return noderuntime.RuntimeInfo{Name: "stub", Version: "1.2.3", Platform: s.platform}, nil
}

func (s stubRuntime) Images(context.Context) ([]schemas.ImageLocality, error) {
	return s.images, s.err
}

func newFactsAgent(t *testing.T, cfg Config, rt noderuntime.Runtime) *Agent {
	t.Helper()
	cfg.NodeID = "node-facts"
	cfg.DataDir = t.TempDir()
	a, err := New(cfg, nil, rt, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.journal.Close() })
	return a
}

var h100 = schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverVersion: "550.54.15", DriverCapability: "12.4",
	Devices: []schemas.AcceleratorDevice{{Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, Count: 2}}}

func TestFacts_UnmeasurableDiskStatedUnknownRestFlows(t *testing.T) {
	hot := schemas.ImageLocality{ManifestDigest: "sha256:" + fmt.Sprintf("%064x", 1), State: schemas.LocalityHot, ContentPresent: true}
	a := newFactsAgent(t, Config{ContentRoot: filepath.Join(t.TempDir(), "no-such-root"),
		Accelerator: AcceleratorProbeFunc(func(context.Context) schemas.AcceleratorFacts { return h100 })},
		stubRuntime{images: []schemas.ImageLocality{hot}})
	if _, err := a.caches.Mounts([]schemas.CacheMount{{Name: "pip", CompatibilityKey: "py3.12", Path: "/root/.cache/pip"}}); err != nil {
		t.Fatal(err)
	}

	f := a.meter.facts(context.Background())
	if f.Host.Disk != (schemas.DiskFacts{}) {
		t.Errorf("disk of a missing content root = %+v, want unknown and empty", f.Host.Disk)
	}
	h := f.Host
	if h.OS != runtime.GOOS || h.Architecture != runtime.GOARCH || h.CPUMillis <= 0 || h.MemoryBytes <= 0 || h.KernelVersion == "" {
		t.Errorf("host facts missing: %+v", h)
	}
	if h.ContainerRuntime != "stub" || h.RuntimeVersion != "1.2.3" {
		t.Errorf("runtime %q %q", h.ContainerRuntime, h.RuntimeVersion)
	}
	if h.Accelerator.GPUCount() != 2 || h.Accelerator.Vendor != "nvidia" {
		t.Errorf("accelerator %+v, want the probe's", h.Accelerator)
	}
	if len(f.Images) != 1 || f.Images[0].ManifestDigest != hot.ManifestDigest {
		t.Errorf("images %+v", f.Images)
	}
	if len(f.Caches) != 1 || f.Caches[0].Name != "pip" || f.Caches[0].CompatibilityKey != "py3.12" {
		t.Errorf("caches %+v", f.Caches)
	}
	if f.ObservedAt.IsZero() {
		t.Error("no ObservedAt")
	}
}

// TestFacts_VariantIsTheRuntimes: the host's CPU variant is what its
// runtime picks builds by, and only for this host's own architecture.
func TestFacts_VariantIsTheRuntimes(t *testing.T) {
	for _, tc := range []struct {
		runtime schemas.Platform
		want    string
	}{
		{schemas.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH, Variant: "v7"}, "v7"},
		{schemas.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}, ""},
		{schemas.Platform{OS: runtime.GOOS, Architecture: "not-" + runtime.GOARCH, Variant: "v7"}, ""},
		{schemas.Platform{}, ""}, // a runtime that does not say
	} {
		a := newFactsAgent(t, Config{ContentRoot: t.TempDir()}, stubRuntime{platform: tc.runtime})
		if h := a.meter.facts(context.Background()).Host; h.Variant != tc.want || h.Architecture != runtime.GOARCH {
			t.Errorf("runtime platform %+v: host %s/%s variant %q, want variant %q", tc.runtime, h.OS, h.Architecture, h.Variant, tc.want)
		}
	}
}

func TestFacts_DiskMeasured(t *testing.T) {
	a := newFactsAgent(t, Config{ContentRoot: t.TempDir()}, stubRuntime{})
	d := a.meter.facts(context.Background()).Host.Disk
	if !d.Known || d.TotalBytes <= 0 || d.FreeBytes <= 0 || d.FreeBytes > d.TotalBytes {
		t.Fatalf("disk %+v, want known with 0 < free <= total", d)
	}
}

func TestFacts_NoProbeConfiguredStatesNothing(t *testing.T) {
	a := newFactsAgent(t, Config{}, stubRuntime{})
	f := a.meter.facts(context.Background())
	if f.Host.Accelerator.Established || f.Host.Disk.Known {
		t.Fatalf("accelerator %+v disk %+v: nothing was measured, nothing may be established", f.Host.Accelerator, f.Host.Disk)
	}
}

func TestFacts_ImageInventoryErrorLeavesTheRest(t *testing.T) {
	a := newFactsAgent(t, Config{ContentRoot: t.TempDir()}, stubRuntime{err: errors.New("containerd away")})
	f := a.meter.facts(context.Background())
	if f.Images != nil || !f.Host.Disk.Known || f.Host.ContainerRuntime != "stub" {
		t.Fatalf("facts %+v", f)
	}
}

func TestFacts_ImageInventoryTrimmedKeepsHottest(t *testing.T) {
	var imgs []schemas.ImageLocality
	for i := range maxFactImages + 44 {
		st := schemas.LocalityCold
		if i%3 == 0 {
			st = schemas.LocalityHot
		}
		imgs = append(imgs, schemas.ImageLocality{ManifestDigest: fmt.Sprintf("sha256:%064x", i), State: st})
	}
	a := newFactsAgent(t, Config{}, stubRuntime{images: imgs})
	got := a.meter.facts(context.Background()).Images
	if len(got) != maxFactImages {
		t.Fatalf("%d images reported, want %d", len(got), maxFactImages)
	}
	hot := 0
	for i, im := range got {
		if im.State == schemas.LocalityHot {
			hot++
		}
		if i > 0 && got[i-1].ManifestDigest >= im.ManifestDigest {
			t.Fatal("trimmed inventory not sorted by digest")
		}
	}
	if want := (maxFactImages + 44 + 2) / 3; hot != want {
		t.Fatalf("%d hot images kept, want all %d", hot, want)
	}
}

func TestFacts_SlowProbeDoesNotHoldFacts(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	a := newFactsAgent(t, Config{Accelerator: AcceleratorProbeFunc(func(context.Context) schemas.AcceleratorFacts {
		<-release // ignores its context, like a hung driver call
		return h100
	})}, stubRuntime{})
	a.meter.accel.timeout = 50 * time.Millisecond
	start := time.Now()
	f := a.meter.facts(context.Background())
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("facts took %v behind a hung probe", took)
	}
	if f.Host.Accelerator.Established {
		t.Fatalf("timed-out probe stated %+v", f.Host.Accelerator)
	}
}
