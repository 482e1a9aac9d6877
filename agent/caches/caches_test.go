package caches

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

func testCaches(t *testing.T, now time.Time) Store {
	return Store{dir: t.TempDir(), maxEntries: cacheWalkEntries, budget: time.Minute,
		now: func() time.Time { return now }, log: zaptest.NewLogger(t)}
}

func TestCaches_MountCreatesDirAndMarksUse(t *testing.T) {
	used := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	c := testCaches(t, used)
	ms, err := c.Mounts([]schemas.CacheMount{
		{Name: "pip", CompatibilityKey: "py3.12", Path: "/root/.cache/pip"},
		{Name: "models", Path: "/models", ReadOnly: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []noderuntime.Mount{
		{Source: filepath.Join(c.dir, "pip", "py3.12"), Target: "/root/.cache/pip"},
		{Source: filepath.Join(c.dir, "models", "_"), Target: "/models", ReadOnly: true},
	}
	if fmt.Sprint(ms) != fmt.Sprint(want) {
		t.Fatalf("mounts %+v, want %+v", ms, want)
	}
	for _, m := range ms {
		st, err := os.Stat(m.Source)
		if err != nil || !st.IsDir() || st.Mode().Perm()&0o700 != 0o700 {
			t.Fatalf("cache dir %s: %v %v", m.Source, st, err)
		}
	}
	facts := c.Facts(context.Background())
	if len(facts) != 2 {
		t.Fatalf("facts %+v", facts)
	}
	// ReadDir order: models before pip.
	if f := facts[0]; f.Name != "models" || f.CompatibilityKey != "" || !f.LastUsedAt.Equal(used) {
		t.Errorf("models fact %+v, want no key and last used %v", f, used)
	}
	if f := facts[1]; f.Name != "pip" || f.CompatibilityKey != "py3.12" || !f.LastUsedAt.Equal(used) {
		t.Errorf("pip fact %+v", f)
	}
	// The marker is outside what the container sees.
	if entries, _ := os.ReadDir(ms[0].Source); len(entries) != 0 {
		t.Errorf("mounted dir holds %v, want nothing the agent put there", entries)
	}
}

func TestCaches_RefusesPathsOutsideTheCacheDir(t *testing.T) {
	c := testCaches(t, time.Now())
	for _, cm := range []schemas.CacheMount{
		{Name: "..", Path: "/x"},
		{Name: "a/b", Path: "/x"},
		{Name: "_", Path: "/x"},
		{Name: "ok", CompatibilityKey: "../../etc", Path: "/x"},
		{Name: "ok", CompatibilityKey: ".hidden", Path: "/x"},
		{Name: "ok", Path: "relative"},
		{Name: "ok", Path: "/a/../b"},
		{Name: "ok", Path: "/"},
	} {
		if _, err := c.Mounts([]schemas.CacheMount{cm}); !errors.Is(err, ErrInvalid) {
			t.Errorf("mounts(%+v) = %v, want ErrInvalid", cm, err)
		}
	}
	if entries, _ := os.ReadDir(c.dir); len(entries) != 0 {
		t.Fatalf("refused mounts created %v", entries)
	}
}

// fill writes n files of size bytes each into a cache, in nested dirs.
func fill(t *testing.T, dir string, n, size int) {
	t.Helper()
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d%d", i%4), fmt.Sprintf("f%d", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(strings.Repeat("x", size)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCaches_SizeCountsRegularFiles(t *testing.T) {
	c := testCaches(t, time.Now())
	ms, err := c.Mounts([]schemas.CacheMount{{Name: "data", CompatibilityKey: "v1", Path: "/data"}})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, ms[0].Source, 40, 100)
	if err := os.Symlink("/etc/passwd", filepath.Join(ms[0].Source, "link")); err != nil {
		t.Fatal(err)
	}
	// Strays beside the caches are not caches.
	if err := os.WriteFile(filepath.Join(c.dir, "stray-file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(c.dir, ".trash", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	facts := c.Facts(context.Background())
	if len(facts) != 1 || facts[0].SizeBytes != 4000 {
		t.Fatalf("facts %+v, want one cache of 4000 bytes", facts)
	}
}

func TestCaches_WalkIsBounded(t *testing.T) {
	c := testCaches(t, time.Now())
	ms, err := c.Mounts([]schemas.CacheMount{{Name: "big", Path: "/big"}, {Name: "late", Path: "/late"}})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, ms[0].Source, 200, 10)
	fill(t, ms[1].Source, 5, 10)

	c.maxEntries = 50
	facts := c.Facts(context.Background())
	if len(facts) != 2 {
		t.Fatalf("facts %+v", facts)
	}
	if s := facts[0].SizeBytes; s <= 0 || s >= 2000 {
		t.Errorf("entry-bounded size %d, want counted part of 2000", s)
	}
	if s := facts[1].SizeBytes; s != 50 {
		t.Errorf("small cache size %d, want all 50: the bound is per cache", s)
	}

	// A spent time budget still lists every cache, each counted as far as it got.
	c.maxEntries, c.budget = cacheWalkEntries, 0
	facts = c.Facts(context.Background())
	if len(facts) != 2 || facts[0].SizeBytes != 0 || facts[1].SizeBytes != 0 || facts[0].LastUsedAt.IsZero() {
		t.Errorf("facts after the time budget %+v, want both listed, uncounted, with last use", facts)
	}
}

func TestCaches_NoDirNoFacts(t *testing.T) {
	c := testCaches(t, time.Now())
	c.dir = filepath.Join(c.dir, "never-created")
	if f := c.Facts(context.Background()); f != nil {
		t.Fatalf("facts %+v from a missing cache dir", f)
	}
}
