// Package caches is a node's cache directory: the caches Runs mount,
// created on first use and marked used at every mount, measured for facts
// and removed by disk collection.
package caches

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Cache layout under Config.CacheDir:
//
//	<name>/<compatibility key, or "_" for none>/   the directory a Run mounts
//	<name>/.<key or "_">.last-used                 touched at every mount
//
// The marker sits beside the mounted directory, not in it, so a workload can
// neither see nor delete it. Keys never start with "." or equal "_" (see
// cacheKeyPattern), so no marker or placeholder collides with a real key.
const noCacheKey = "_"

// ErrInvalid reports a cache mount whose name, key or path this agent
// refuses: they become host paths, so only the validated shapes pass.
var ErrInvalid = errors.New("invalid cache mount")

// The shapes schemas.RunRequest validation admits, checked again here
// because a command's caches become host paths.
var (
	cacheNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	cacheKeyPattern  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
)

// Bounds on measuring caches for one facts report: a cache holding millions
// of files is counted up to a point and reported as counted.
const (
	cacheWalkEntries = 100_000         // entries counted per cache
	cacheWalkBudget  = 2 * time.Second // for every cache of one report
	maxFactCaches    = 256
)

// Store is the node's cache directory.
type Store struct {
	dir        string
	maxEntries int           // per cache
	budget     time.Duration // per facts report
	now        func() time.Time
	log        *zap.Logger
}

// New returns the cache directory dir, with the walk bounds of one facts
// report.
func New(dir string, now func() time.Time, log *zap.Logger) Store {
	return Store{dir: dir, maxEntries: cacheWalkEntries, budget: cacheWalkBudget, now: now, log: log}
}

// dirs returns a cache's mounted directory and its last-used marker.
func (c Store) dirs(name, key string) (dir, marker string) {
	if key == "" {
		key = noCacheKey
	}
	return filepath.Join(c.dir, name, key), filepath.Join(c.dir, name, "."+key+".last-used")
}

// nameDir holds every key of one cache name.
func (c Store) nameDir(name string) string { return filepath.Join(c.dir, name) }

// mounts creates each requested cache (0755) if it is new, marks it used
// now, and returns the bind mounts a launch needs.
func (c Store) Mounts(caches []schemas.CacheMount) ([]noderuntime.Mount, error) {
	out := make([]noderuntime.Mount, 0, len(caches))
	for _, cm := range caches {
		if err := checkCacheMount(cm); err != nil {
			return nil, err
		}
		dir, marker := c.dirs(cm.Name, cm.CompatibilityKey)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("caches: create cache %s/%s: %w", cm.Name, cm.CompatibilityKey, err)
		}
		if err := touch(marker, c.now()); err != nil {
			return nil, fmt.Errorf("caches: mark cache %s/%s used: %w", cm.Name, cm.CompatibilityKey, err)
		}
		out = append(out, noderuntime.Mount{Source: dir, Target: cm.Path, ReadOnly: cm.ReadOnly})
	}
	return out, nil
}

func checkCacheMount(cm schemas.CacheMount) error {
	switch {
	case !cacheNamePattern.MatchString(cm.Name):
		return fmt.Errorf("%w: name %q", ErrInvalid, cm.Name)
	case cm.CompatibilityKey != "" && !cacheKeyPattern.MatchString(cm.CompatibilityKey):
		return fmt.Errorf("%w: compatibility key %q", ErrInvalid, cm.CompatibilityKey)
	case !filepath.IsAbs(cm.Path) || strings.Contains(cm.Path, "..") || filepath.Clean(cm.Path) == "/":
		return fmt.Errorf("%w: path %q", ErrInvalid, cm.Path)
	}
	return nil
}

func touch(path string, t time.Time) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chtimes(path, t, t)
}

// facts lists the caches this node holds with their sizes and last use.
// Sizes are apparent bytes of regular files, counted within the walk bounds:
// a cache cut short reports what was counted, a lower bound.
func (c Store) Facts(ctx context.Context) []schemas.CacheFact {
	if c.dir == "" {
		return nil
	}
	names, err := os.ReadDir(c.dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			c.log.Warn("cache dir unreadable; no caches reported", zap.String("cache_dir", c.dir), zap.Error(err))
		}
		return nil
	}
	deadline := time.Now().Add(c.budget)
	var out []schemas.CacheFact
	var cut []string
	for _, n := range names {
		if !n.IsDir() || !cacheNamePattern.MatchString(n.Name()) {
			continue
		}
		keys, err := os.ReadDir(filepath.Join(c.dir, n.Name()))
		if err != nil {
			c.log.Warn("cache unreadable", zap.String("cache", n.Name()), zap.Error(err))
			continue
		}
		for _, k := range keys {
			key := k.Name()
			if !k.IsDir() || (key != noCacheKey && !cacheKeyPattern.MatchString(key)) {
				continue
			}
			if len(out) == maxFactCaches || ctx.Err() != nil {
				c.log.Warn("cache inventory cut short for facts", zap.Int("reported", len(out)), zap.Error(ctx.Err()))
				return out
			}
			if key == noCacheKey {
				key = ""
			}
			dir, marker := c.dirs(n.Name(), key)
			f := schemas.CacheFact{Name: n.Name(), CompatibilityKey: key}
			var complete bool
			f.SizeBytes, complete = c.size(ctx, dir, deadline)
			if !complete {
				cut = append(cut, n.Name()+"/"+k.Name())
			}
			if st, err := os.Stat(marker); err == nil {
				f.LastUsedAt = st.ModTime()
			}
			out = append(out, f)
		}
	}
	if len(cut) > 0 {
		c.log.Info("cache sizes counted partly (walk bounds reached)", zap.Strings("caches", cut),
			zap.Int("max_entries", c.maxEntries), zap.Duration("budget", c.budget))
	}
	return out
}

// size adds up the regular files under dir, stopping after maxEntries
// entries, at deadline, or when ctx ends; complete says it did not stop.
func (c Store) size(ctx context.Context, dir string, deadline time.Time) (bytes int64, complete bool) {
	complete = true
	entries := 0
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable entry (or one removed mid-walk): count the rest
		}
		entries++
		if entries > c.maxEntries || ctx.Err() != nil || time.Now().After(deadline) {
			complete = false
			return fs.SkipAll
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				bytes += info.Size()
			}
		}
		return nil
	})
	return bytes, complete
}

// Remove deletes one cache (id is schemas.CacheItemID) with its last-used
// marker, and its name's directory once no key is left in it.
func (c Store) Remove(id string) error {
	name, key, _ := strings.Cut(id, "/")
	dir, marker := c.dirs(name, key)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove cache %s: %w", id, err)
	}
	if err := os.Remove(marker); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove cache %s's marker: %w", id, err)
	}
	_ = os.Remove(c.nameDir(name))
	return nil
}
