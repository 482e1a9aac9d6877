package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_DiskGarbageCollection: containerd's whole directory and
// the agent's caches share a 64 MiB tmpfs, so the percentages are exact.
// Two finished Runs leave an image and a cache each; a third runs on. A
// ballast file then takes the disk past the 50% high watermark, sized so
// that the two least recently used items (the first Run's cache, then its
// image) bring it back to the 45% low watermark and one fewer would not.
// The node evicts exactly those, never the running Run's image or cache,
// reports the freed disk in its facts, and runs the evicted image again.
func TestAcceptance_DiskGarbageCollection(t *testing.T) {
	const diskSize = 64 << 20
	w := newWorld(t, testenv.WithDiskSize(diskSize))
	f := newFleet(t)
	cacheDir := filepath.Join(w.ctrd.Dir, "caches")
	watermarks := schemas.DiskWatermarks{High: 50, Low: 45}
	f.startConfiguredAgent("disk-node", w, tempDir(t), func(c *agent.Config) {
		c.ContentRoot, c.CacheDir = w.ctrd.Dir, cacheDir
		c.DiskWatermarks = &watermarks
		c.FactsInterval = 300 * time.Millisecond
	})
	imgs := map[string]testenv.Image{}
	for _, name := range []string{"first", "second", "running"} {
		imgs[name] = testenv.BuildBusyboxImage(t, w.imageDir, "gc-"+name, testenv.WithFile("/etc/variant", name))
	}
	const cacheMiB = 4
	fill := "dd if=/dev/zero of=/cache/fill bs=1048576 count=" + strconv.Itoa(cacheMiB)
	run := func(name, cache, script string) string {
		return f.submit(schemas.RunRequest{RequestID: "gc-" + name, Image: imgs[name].Reference, Command: []string{"sh", "-c", script},
			Caches: []schemas.CacheMount{{Name: cache, Path: "/cache"}}})
	}
	f.waitPhase(run("first", "c-first", fill), schemas.PhaseSucceeded, 60*time.Second)
	time.Sleep(20 * time.Millisecond) // distinct last-use times
	f.waitPhase(run("second", "c-second", fill), schemas.PhaseSucceeded, 60*time.Second)
	time.Sleep(20 * time.Millisecond)
	runningID := run("running", "c-running", fill+" && sleep 300")
	f.waitPhase(runningID, schemas.PhaseRunning, 60*time.Second)
	f.eventually(30*time.Second, "the running Run's cache filled", func() bool {
		st, err := os.Stat(filepath.Join(cacheDir, "c-running", "_", "fill"))
		return err == nil && st.Size() == cacheMiB<<20
	})
	// Nothing was collected so far: the disk stayed below the high watermark.
	for _, c := range []string{"c-first", "c-second", "c-running"} {
		requireExists(t, filepath.Join(cacheDir, c, "_"), true)
	}

	// The first image's footprint, as the runtime counts it.
	use := imageUsage(t, w)
	firstImage := use[imgs["first"].ManifestDigest]
	if firstImage <= 0 {
		t.Fatalf("first image's usage %d; usage %+v", firstImage, use)
	}
	total, used := statDisk(t, w.ctrd.Dir)
	if total != diskSize {
		t.Fatalf("tmpfs holds %d bytes, want %d", total, diskSize)
	}
	// Evicting the first cache alone leaves it above low; the first cache
	// and the first image bring it below: half the image's size either way.
	target := int64(watermarks.Low)*total/100 + cacheMiB<<20 + firstImage/2
	if target <= int64(watermarks.High)*total/100 || used >= target {
		t.Fatalf("disk sizing: %d of %d used, target %d must be above the high watermark and above what is used", used, total, target)
	}
	t.Logf("disk: %d of %d used; ballast to %d (first image %d bytes, first cache %d)", used, total, target, firstImage, cacheMiB<<20)
	ballast(t, filepath.Join(w.ctrd.Dir, "ballast"), target-used)

	f.eventually(30*time.Second, "the first cache and image collected", func() bool {
		_, err := os.Stat(filepath.Join(cacheDir, "c-first", "_"))
		_, held := imageUsage(t, w)[imgs["first"].ManifestDigest]
		return errors.Is(err, fs.ErrNotExist) && !held
	})
	// The image is gone from containerd's list before its content is (the
	// runtime's delete waits for containerd's collection of it): the
	// collection's end is when the disk is back under the low watermark.
	var after int64
	f.eventually(30*time.Second, "the collection to free the disk", func() bool {
		_, after = statDisk(t, w.ctrd.Dir)
		return 100*float64(after)/float64(total) <= float64(watermarks.Low)
	})
	// Only as much as needed, least recently used first; the running Run's
	// image and cache are never candidates: not in this collection, nor in
	// the next one, which precedes the second facts report measured after
	// this one ended.
	f.waitFactsReports("disk-node", time.Now(), 2, 30*time.Second)
	use = imageUsage(t, w)
	for _, name := range []string{"second", "running"} {
		if _, ok := use[imgs[name].ManifestDigest]; !ok {
			t.Errorf("image of the %s Run was collected; only the least recently used ones should go", name)
		}
	}
	requireExists(t, filepath.Join(cacheDir, "c-second", "_", "fill"), true)
	requireExists(t, filepath.Join(cacheDir, "c-running", "_", "fill"), true)
	if r, _ := f.run(runningID); r.Phase != schemas.PhaseRunning {
		t.Fatalf("the running Run is %s after the collection", r.Phase)
	}

	// The node's facts carry the freed disk.
	f.eventually(30*time.Second, "facts with the disk after collection", func() bool {
		facts := f.nodeRecord("disk-node").Facts
		if facts == nil || !facts.Host.Disk.Known {
			return false
		}
		d := facts.Host.Disk
		return 100*float64(d.TotalBytes-d.FreeBytes)/float64(d.TotalBytes) <= float64(watermarks.Low)+1
	})
	if s := f.nodeRecord("disk-node").Facts.Support; s == nil || !s.GarbageCollection || s.DiskWatermarks == nil || *s.DiskWatermarks != watermarks {
		t.Errorf("facts declare support %+v, want garbage collection between %+v", s, watermarks)
	}

	// The node keeps taking Runs, the evicted image among them.
	again := f.submit(schemas.RunRequest{RequestID: "gc-again", Image: imgs["first"].Reference, Command: []string{"true"}})
	f.waitPhase(again, schemas.PhaseSucceeded, 60*time.Second)
}

// imageUsage is what containerd holds in the world's namespace, by digest,
// as the runtime measures it (a runtime of the test's own over the same
// namespace).
func imageUsage(t *testing.T, w world) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts := w.runtimeOptions("", zap.NewNop())
	opts.LogDir, opts.StateDir = t.TempDir(), t.TempDir()
	rt, err := containerd.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	all, err := rt.ImageUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, u := range all {
		out[u.ManifestDigest] = u.SizeBytes
	}
	return out
}

// statDisk is the filesystem's size and bytes used, as the agent measures.
func statDisk(t *testing.T, dir string) (total, used int64) {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	total = int64(st.Blocks) * st.Frsize
	return total, total - int64(st.Bavail)*st.Frsize
}

// ballast writes n bytes to path, so the tmpfs holds them.
func ballast(t *testing.T, path string, n int64) {
	t.Helper()
	b := make([]byte, n)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func requireExists(t *testing.T, path string, want bool) {
	t.Helper()
	_, err := os.Stat(path)
	if got := err == nil; got != want {
		t.Fatalf("%s exists: %v, want %v (err %v)", path, got, want, err)
	}
}

// waitFactsReports waits until node's record holds the n-th facts report
// measured after since: the agent collects its disk (when past the high
// watermark) before each report, so every report after the first one
// counted follows a whole collection that began after since.
func (f *fleet) waitFactsReports(node string, since time.Time, n int, within time.Duration) {
	f.t.Helper()
	var seen []time.Time
	f.eventually(within, fmt.Sprintf("%d facts reports of %s measured after %s", n, node, since.Format(time.StampMilli)), func() bool {
		facts := f.nodeRecord(node).Facts
		if facts != nil && facts.ObservedAt.After(since) && !slices.ContainsFunc(seen, facts.ObservedAt.Equal) {
			seen = append(seen, facts.ObservedAt)
		}
		return len(seen) >= n
	})
}
