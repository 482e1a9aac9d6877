// Package disk is a node's disk collection: past the high watermark of the
// content disk it removes images, caches and artifact replicas nothing uses
// or keeps, least recently used first, down to the low watermark; an
// operator's prune removes all of them. The plan is a pure function
// (plan.go); the Collector measures, plans and removes, and holds the lock
// that keeps a collection from removing what a prepare or launch is about
// to use.
package disk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Labels on a workload that name what it mounts (comma-separated), so
// collection keeps them while the workload exists, across agent restarts
// too.
const (
	// LabelCaches lists schemas.CacheItemID of each cache.
	LabelCaches = "warmfleet.caches"
	// LabelArtifacts lists the artifact digests.
	LabelArtifacts = "warmfleet.artifacts"
)

// Runtime is what collection needs of the node's container runtime.
type Runtime interface {
	List(ctx context.Context) ([]noderuntime.WorkloadStatus, error)
	ImageUsage(ctx context.Context) ([]noderuntime.ImageUse, error)
	RemoveImage(ctx context.Context, manifestDigest string) (noderuntime.RemovedImage, error)
}

// Holding is what one attempt that has not ended holds on disk: what it
// prepared, and what its launch mounts.
type Holding struct {
	Attempt   string
	Image     string   // manifest digest; empty for none
	Caches    []string // schemas.CacheItemID
	Artifacts []string // sha256 digests
}

// Busy tells what the node's attempts hold now.
type Busy interface {
	Holdings() []Holding
}

// Caches is the node's cache directory (agent/caches).
type Caches interface {
	Facts(ctx context.Context) []schemas.CacheFact
	Remove(id string) error
}

// Artifacts is the node's artifact replica store (agent/artifactstore).
type Artifacts interface {
	List() []schemas.ArtifactReplica
	Remove(digest string) error
}

// Metrics receives each eviction; internal/metrics implements it.
type Metrics interface {
	Evicted(kind string, bytes int64)
}

// Config is what a Collector works on.
type Config struct {
	NodeID string
	// ContentRoot is on the disk collected; CacheDir and ArtifactDir are
	// collected with it only when they share its filesystem (a prune
	// takes them wherever they are).
	ContentRoot, CacheDir, ArtifactDir string
	// Watermarks turn on collection by Collect; nil collects nothing.
	Watermarks *schemas.DiskWatermarks
	Runtime    Runtime
	Busy       Busy
	Caches     Caches
	Artifacts  Artifacts // nil: the node keeps no replicas
	Metrics    Metrics   // nil: none
	// Removed is called after a sweep removed something.
	Removed func()
	Log     *zap.Logger
}

// Collector collects one node's disk.
type Collector struct {
	cfg Config
	// mu: a sweep holds it to write; a prepare or launch holds it to read
	// (Use) while it ensures an image, mounts caches and starts, so a sweep
	// never removes what one is about to use.
	mu sync.RWMutex
}

// New returns a collector over cfg.
func New(cfg Config) *Collector { return &Collector{cfg: cfg} }

// Use holds off sweeps until done is called: what the caller ensures or
// mounts meanwhile stays, and is held by its attempt (Busy) before done.
func (c *Collector) Use() (done func()) {
	c.mu.RLock()
	return c.mu.RUnlock
}

// Collect runs a collection when the content disk is past its high
// watermark. Without keep's answer about what booked Runs need, it removes
// nothing: a queued Run's image must not go because the control plane was
// briefly unreachable.
func (c *Collector) Collect(ctx context.Context, keep func(context.Context) (schemas.DiskKeep, error)) {
	w := c.cfg.Watermarks
	if w == nil || c.cfg.ContentRoot == "" {
		return
	}
	if !overHigh(Measure(c.cfg.ContentRoot, c.cfg.Log), *w) {
		return
	}
	k, err := keep(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.cfg.Log.Warn("disk past its high watermark, but the control plane did not say what booked Runs need; collecting later", zap.Error(err))
		}
		return
	}
	rep := c.Sweep(ctx, k, false, false)
	if len(rep.Removed) == 0 {
		c.cfg.Log.Warn("disk past its high watermark, and nothing on it may be removed", zap.Float64("used_percent", usedPercent(rep.Before)),
			zap.Int("kept", len(rep.Kept)), zap.Int("failed", len(rep.Failed)))
		return
	}
	c.cfg.Log.Info("disk collected", zap.Int("removed", len(rep.Removed)), zap.Int64("freed_bytes", rep.FreedBytes),
		zap.Float64("used_percent_before", usedPercent(rep.Before)), zap.Float64("used_percent_after", usedPercent(rep.After)))
}

// Sweep removes images, caches and replicas nothing uses or keeps, least
// recently used first: down to the low watermark, or all of them when
// prune is set. A dry run removes nothing and reports what it would.
// Prepares and launches wait while it runs (Use).
func (c *Collector) Sweep(ctx context.Context, keep schemas.DiskKeep, prune, dryRun bool) schemas.PruneReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	rep := schemas.PruneReport{NodeID: c.cfg.NodeID, DryRun: dryRun, Before: Measure(c.cfg.ContentRoot, c.cfg.Log)}
	snap, err := c.snapshot(ctx, keep, rep.Before, prune)
	if err != nil {
		c.cfg.Log.Warn("disk collection: cannot tell what the node holds; removing nothing", zap.Error(err))
		rep.After = rep.Before
		return rep
	}
	var p plan
	if prune {
		p = planPrune(snap)
	} else {
		p = planWatermarks(snap, *c.cfg.Watermarks)
	}
	rep.Kept = p.Kept
	if dryRun {
		rep.Removed = p.Order[:p.Evict]
		for _, it := range rep.Removed {
			rep.FreedBytes += it.SizeBytes
		}
		rep.After = rep.Before
		return rep
	}
	c.remove(ctx, p, prune, &rep)
	rep.After = Measure(c.cfg.ContentRoot, c.cfg.Log)
	if len(rep.Removed) > 0 && c.cfg.Removed != nil {
		c.cfg.Removed()
	}
	return rep
}

// remove walks the plan's order, removing each item until the disk is at or
// below the low watermark (all of them for a prune), and records each
// removal and failure in rep.
func (c *Collector) remove(ctx context.Context, p plan, prune bool, rep *schemas.PruneReport) {
	for _, it := range p.Order {
		// Measured, not projected: images share layers, so an image's
		// size can overstate what its removal frees.
		if !prune && atOrBelowLow(Measure(c.cfg.ContentRoot, c.cfg.Log), *c.cfg.Watermarks) {
			return
		}
		freed, err := c.evict(ctx, it)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.cfg.Log.Warn("disk collection: removal failed", zap.String("kind", it.Kind), zap.String("id", it.ID), zap.Error(err))
			it.Reason = err.Error()
			rep.Failed = append(rep.Failed, it)
			continue
		}
		c.cfg.Log.Info("evicted from disk", zap.String("kind", it.Kind), zap.String("id", it.ID), zap.Int64("size_bytes", it.SizeBytes),
			zap.Int64("freed_bytes", freed), zap.String("last_used", lastUsed(it.LastUsedAt)), zap.String("why", it.Reason))
		if m := c.cfg.Metrics; m != nil {
			m.Evicted(it.Kind, freed)
		}
		rep.Removed = append(rep.Removed, it)
		rep.FreedBytes += freed
	}
}

// evict removes one item and returns the bytes it freed.
func (c *Collector) evict(ctx context.Context, it schemas.DiskItem) (int64, error) {
	switch it.Kind {
	case schemas.DiskItemImage:
		res, err := c.cfg.Runtime.RemoveImage(ctx, it.ID)
		return res.Freed, err
	case schemas.DiskItemCache:
		if err := c.cfg.Caches.Remove(it.ID); err != nil {
			return 0, err
		}
		return it.SizeBytes, nil
	case schemas.DiskItemArtifact:
		if c.cfg.Artifacts == nil {
			return 0, errors.New("this node keeps no artifact replicas")
		}
		if err := c.cfg.Artifacts.Remove(it.ID); err != nil {
			return 0, err
		}
		return it.SizeBytes, nil
	}
	return 0, fmt.Errorf("unknown disk item kind %q", it.Kind)
}

// snapshot lists what the node holds and what is busy: images, caches and
// artifacts of every workload the runtime holds (running or not yet
// removed), of every attempt that has not ended (Busy), and what the
// control plane keeps. A collection (not a prune) leaves caches and
// replicas out when they live on another filesystem than the content root:
// removing them would free nothing on the disk being collected.
func (c *Collector) snapshot(ctx context.Context, keep schemas.DiskKeep, disk schemas.DiskFacts, prune bool) (snapshot, error) {
	s := snapshot{Disk: disk, Busy: map[string]string{}, Keep: keepSet(keep)}
	workloads, err := c.cfg.Runtime.List(ctx)
	if err != nil {
		return s, fmt.Errorf("list workloads: %w", err)
	}
	for _, st := range workloads {
		s.busy(schemas.DiskItemImage, []string{st.ManifestDigest}, "used by workload "+st.ID)
		s.busy(schemas.DiskItemCache, strings.Split(st.Labels[LabelCaches], ","), "mounted by workload "+st.ID)
		s.busy(schemas.DiskItemArtifact, strings.Split(st.Labels[LabelArtifacts], ","), "mounted by workload "+st.ID)
	}
	for _, h := range c.cfg.Busy.Holdings() {
		s.busy(schemas.DiskItemImage, []string{h.Image}, "prepared for attempt "+h.Attempt)
		s.busy(schemas.DiskItemCache, h.Caches, "mounted by attempt "+h.Attempt)
		s.busy(schemas.DiskItemArtifact, h.Artifacts, "prepared for attempt "+h.Attempt)
	}
	imgs, err := c.cfg.Runtime.ImageUsage(ctx)
	if err != nil {
		return s, fmt.Errorf("image usage: %w", err)
	}
	for _, im := range imgs {
		s.Items = append(s.Items, schemas.DiskItem{Kind: schemas.DiskItemImage, ID: im.ManifestDigest, SizeBytes: im.SizeBytes, LastUsedAt: im.LastUsedAt})
	}
	if c.cfg.Artifacts != nil && (prune || sameFilesystem(c.cfg.ArtifactDir, c.cfg.ContentRoot)) {
		for _, r := range c.cfg.Artifacts.List() {
			s.Items = append(s.Items, schemas.DiskItem{Kind: schemas.DiskItemArtifact, ID: r.Digest, SizeBytes: r.SizeBytes, LastUsedAt: r.LastUsedAt})
		}
	}
	if !prune && !sameFilesystem(c.cfg.CacheDir, c.cfg.ContentRoot) {
		return s, nil
	}
	for _, cf := range c.cfg.Caches.Facts(ctx) {
		s.Items = append(s.Items, schemas.DiskItem{Kind: schemas.DiskItemCache, ID: schemas.CacheItemID(cf.Name, cf.CompatibilityKey),
			SizeBytes: cf.SizeBytes, LastUsedAt: cf.LastUsedAt})
	}
	return s, nil
}
