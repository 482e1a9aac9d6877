package disk

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/agent/caches"
	"github.com/warmfleet/warmfleet/internal/metrics"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// A prune removes every image and cache nothing uses or keeps, and reports
// each kept one with why: the image and cache of a workload the runtime
// holds, the image an attempt prepared, and what the control plane keeps.
// A dry run reports the same and removes nothing.
func TestSweepPruneKeepsWhatIsUsedHeldOrKept(t *testing.T) {
	digest := func(i int) string { return fmt.Sprintf("sha256:%064x", i) }
	running, prepared, kept, idle := digest(1), digest(2), digest(3), digest(4)
	rt := noopruntime.New(noopruntime.Options{Images: []string{running, prepared, kept, idle}})
	reg := prometheus.NewRegistry()
	m := metrics.NewAgentDisk(reg, "node-disk")
	cacheDir := t.TempDir()
	cs := caches.New(cacheDir, time.Now, zaptest.NewLogger(t))
	held := heldBy{}
	removed := 0
	c := New(Config{NodeID: "node-disk", ContentRoot: t.TempDir(), CacheDir: cacheDir, Runtime: rt, Busy: held, Caches: cs,
		Metrics: m, Removed: func() { removed++ }, Log: zaptest.NewLogger(t)})
	ctx := context.Background()

	mounts, err := cs.Mounts([]schemas.CacheMount{{Name: "c-run", Path: "/a"}, {Name: "c-kept", CompatibilityKey: "v1", Path: "/b"}, {Name: "c-idle", Path: "/c"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, mt := range mounts {
		if err := os.WriteFile(filepath.Join(mt.Source, "data"), make([]byte, 1000), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rt.Launch(ctx, noderuntime.WorkloadSpec{ID: "w1", ManifestDigest: running, Labels: map[string]string{LabelCaches: "c-run"}}); err != nil {
		t.Fatal(err)
	}
	held["att-2"] = Holding{Attempt: "att-2", Image: prepared}
	keep := schemas.DiskKeep{Items: []schemas.DiskItem{
		{Kind: schemas.DiskItemImage, ID: kept, Reason: "queued here for run r3"},
		{Kind: schemas.DiskItemCache, ID: "c-kept/v1", Reason: "queued here for run r3"},
	}}
	wantKept := map[string]string{
		running: "used by workload w1", prepared: "prepared for attempt att-2", kept: "queued here for run r3",
		"c-run": "mounted by workload w1", "c-kept/v1": "queued here for run r3",
	}
	check := func(rep schemas.PruneReport) {
		t.Helper()
		// Least recently used first: the image was held before the cache
		// was made.
		if len(rep.Removed) != 2 || rep.Removed[0].ID != idle || rep.Removed[1].ID != "c-idle" {
			t.Errorf("removed %+v, want the idle image, then the idle cache", rep.Removed)
		}
		if rep.FreedBytes < 1000 {
			t.Errorf("freed %d bytes, want at least the idle cache's 1000", rep.FreedBytes)
		}
		if len(rep.Kept) != len(wantKept) {
			t.Errorf("kept %+v, want %v", rep.Kept, wantKept)
		}
		for _, it := range rep.Kept {
			if wantKept[it.ID] != it.Reason {
				t.Errorf("kept %s because %q, want %q", it.ID, it.Reason, wantKept[it.ID])
			}
		}
	}

	dry := c.Sweep(ctx, keep, true, true)
	check(dry)
	if !dry.DryRun {
		t.Error("a dry run's report does not say so")
	}
	if imgs, _ := rt.ImageUsage(ctx); len(imgs) != 4 {
		t.Fatalf("a dry run removed images: %d left", len(imgs))
	}
	requireDir(t, filepath.Join(cacheDir, "c-idle", "_"), true)

	rep := c.Sweep(ctx, keep, true, false)
	check(rep)
	imgs, _ := rt.ImageUsage(ctx)
	left := map[string]bool{}
	for _, im := range imgs {
		left[im.ManifestDigest] = true
	}
	if len(left) != 3 || left[idle] {
		t.Errorf("images left %v, want all but the idle one", left)
	}
	requireDir(t, filepath.Join(cacheDir, "c-idle"), false)
	requireDir(t, filepath.Join(cacheDir, "c-run", "_"), true)
	requireDir(t, filepath.Join(cacheDir, "c-kept", "v1"), true)
	if got := evictions(t, reg); got[schemas.DiskItemCache] != 1 || got[schemas.DiskItemImage] != 1 {
		t.Errorf("evictions counted %v, want one cache and one image", got)
	}
	if removed != 1 {
		t.Errorf("a sweep that removed something told of it %d times, want once (a facts report follows)", removed)
	}

	// Once the attempt's workload is removed, its image may go.
	delete(held, "att-2")
	if rep := c.Sweep(ctx, keep, true, false); len(rep.Removed) != 1 || rep.Removed[0].ID != prepared {
		t.Errorf("after the attempt ended, removed %+v, want its image", rep.Removed)
	}
}

func requireDir(t *testing.T, path string, want bool) {
	t.Helper()
	_, err := os.Stat(path)
	if (err == nil) != want {
		t.Fatalf("%s exists: %v, want %v (err %v)", path, err == nil, want, err)
	}
}

// evictions reads warmfleet_agent_disk_evictions_total by kind.
func evictions(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "warmfleet_agent_disk_evictions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// heldBy is what attempts hold, by attempt id.
type heldBy map[string]Holding

func (h heldBy) Holdings() []Holding {
	out := make([]Holding, 0, len(h))
	for _, x := range h {
		out = append(out, x)
	}
	return out
}

// A sweep waits for every prepare or launch using the disk (Use) and
// removes nothing they held once they are done; one that begins while a
// sweep runs waits for it.
func TestSweepWaitsForUse(t *testing.T) {
	img := fmt.Sprintf("sha256:%064x", 1)
	rt := noopruntime.New(noopruntime.Options{Images: []string{img}})
	held := heldBy{}
	c := New(Config{NodeID: "node-disk", ContentRoot: t.TempDir(), CacheDir: t.TempDir(), Runtime: rt, Busy: held,
		Caches: caches.New(t.TempDir(), time.Now, zaptest.NewLogger(t)), Log: zaptest.NewLogger(t)})
	done := c.Use()
	swept := make(chan schemas.PruneReport)
	go func() { swept <- c.Sweep(context.Background(), schemas.DiskKeep{}, true, false) }()
	select {
	case <-swept:
		t.Fatal("a sweep ran while a launch was using the disk")
	case <-time.After(100 * time.Millisecond):
	}
	held["att-1"] = Holding{Attempt: "att-1", Image: img} // the launch holds its image before it is done
	done()
	if rep := <-swept; len(rep.Removed) != 0 || len(rep.Kept) != 1 || rep.Kept[0].Reason != "prepared for attempt att-1" {
		t.Fatalf("sweep after the launch: removed %+v, kept %+v", rep.Removed, rep.Kept)
	}
}
