package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// LabelCaches lists the caches a workload mounts (schemas.CacheItemID,
// comma-separated), so disk collection keeps them while the workload
// exists, across agent restarts too.
const LabelCaches = "warmfleet.caches"

// DiskMetrics receives each eviction; internal/metrics implements it.
type DiskMetrics interface {
	Evicted(kind string, bytes int64)
}

// keepTimeout bounds asking the control plane what to keep.
const keepTimeout = 5 * time.Second

// heldItems is what one attempt holds on disk from its prepare or launch
// until its workload is removed: its image, and its caches once launched.
type heldItems struct {
	digest    string
	caches    []string // schemas.CacheItemID
	artifacts []string // sha256 digests
}

// hold records what an attempt uses; a later call for it adds to it.
func (a *Agent) hold(attemptID, digest string, caches []schemas.CacheMount) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.held[attemptID]
	if digest != "" {
		h.digest = digest
	}
	for _, c := range caches {
		h.caches = append(h.caches, schemas.CacheItemID(c.Name, c.CompatibilityKey))
	}
	a.held[attemptID] = h
}

// release forgets what an attempt held: its workload is removed, or it
// never launched.
func (a *Agent) release(attemptID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.held, attemptID)
	delete(a.failedPrep, attemptID)
}

// collectDisk runs a collection when the content disk is past its high
// watermark. Without an answer from the control plane about what booked
// Runs need, it removes nothing: a queued Run's image must not go because
// the control plane was briefly unreachable.
func (a *Agent) collectDisk(ctx context.Context) {
	w := a.cfg.DiskWatermarks
	if w == nil || a.cfg.ContentRoot == "" {
		return
	}
	if !overHigh(diskFacts(a.cfg.ContentRoot, a.log), *w) {
		return
	}
	keep, err := a.askKeep(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("disk past its high watermark, but the control plane did not say what booked Runs need; collecting later", zap.Error(err))
		}
		return
	}
	rep := a.sweep(ctx, keep, false, false)
	if len(rep.Removed) == 0 {
		a.log.Warn("disk past its high watermark, and nothing on it may be removed", zap.Float64("used_percent", usedPercent(rep.Before)),
			zap.Int("kept", len(rep.Kept)), zap.Int("failed", len(rep.Failed)))
		return
	}
	a.log.Info("disk collected", zap.Int("removed", len(rep.Removed)), zap.Int64("freed_bytes", rep.FreedBytes),
		zap.Float64("used_percent_before", usedPercent(rep.Before)), zap.Float64("used_percent_after", usedPercent(rep.After)))
}

// askKeep asks the control plane what Runs booked or queued here need.
func (a *Agent) askKeep(ctx context.Context) (schemas.DiskKeep, error) {
	req := schemas.DiskKeepRequest{NodeID: a.cfg.NodeID, FencingToken: a.Enrollment().FencingToken}
	var rep schemas.Reply[schemas.DiskKeep]
	rctx, cancel := context.WithTimeout(ctx, keepTimeout)
	defer cancel()
	if err := a.request(rctx, bus.NodeDiskKeep(a.cfg.NodeID), req, &rep); err != nil {
		return schemas.DiskKeep{}, fmt.Errorf("agent: ask what to keep: %w", err)
	}
	if rep.Refusal != nil {
		return schemas.DiskKeep{}, fmt.Errorf("agent: ask what to keep: %w", rep.Refusal)
	}
	if rep.OK == nil {
		return schemas.DiskKeep{}, errors.New("agent: ask what to keep: empty reply")
	}
	if err := rep.OK.Validate(); err != nil {
		return schemas.DiskKeep{}, fmt.Errorf("agent: ask what to keep: %w", err)
	}
	return *rep.OK, nil
}

// sweep removes images and caches nothing uses or keeps, least recently
// used first: down to the low watermark, or all of them when prune is
// set. A dry run removes nothing and reports what it would. Launches and
// prepares wait while it runs (diskMu), so nothing is taken from under one.
func (a *Agent) sweep(ctx context.Context, keep schemas.DiskKeep, prune, dryRun bool) schemas.PruneReport {
	a.diskMu.Lock()
	defer a.diskMu.Unlock()
	rep := schemas.PruneReport{NodeID: a.cfg.NodeID, DryRun: dryRun, Before: diskFacts(a.cfg.ContentRoot, a.log)}
	snap, err := a.diskSnapshot(ctx, keep, rep.Before, prune)
	if err != nil {
		a.log.Warn("disk collection: cannot tell what the node holds; removing nothing", zap.Error(err))
		rep.After = rep.Before
		return rep
	}
	var plan diskPlan
	if prune {
		plan = planPrune(snap)
	} else {
		plan = planWatermarks(snap, *a.cfg.DiskWatermarks)
	}
	rep.Kept = plan.Kept
	if dryRun {
		rep.Removed = plan.Order[:plan.Evict]
		for _, it := range rep.Removed {
			rep.FreedBytes += it.SizeBytes
		}
		rep.After = rep.Before
		return rep
	}
	for _, it := range plan.Order {
		// Measured, not projected: images share layers, so an image's
		// size can overstate what its removal frees.
		if !prune && atOrBelowLow(diskFacts(a.cfg.ContentRoot, a.log), *a.cfg.DiskWatermarks) {
			break
		}
		freed, err := a.evict(ctx, it)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			a.log.Warn("disk collection: removal failed", zap.String("kind", it.Kind), zap.String("id", it.ID), zap.Error(err))
			it.Reason = err.Error()
			rep.Failed = append(rep.Failed, it)
			continue
		}
		a.log.Info("evicted from disk", zap.String("kind", it.Kind), zap.String("id", it.ID), zap.Int64("size_bytes", it.SizeBytes),
			zap.Int64("freed_bytes", freed), zap.String("last_used", lastUsed(it.LastUsedAt)), zap.String("why", it.Reason))
		if m := a.cfg.DiskMetrics; m != nil {
			m.Evicted(it.Kind, freed)
		}
		rep.Removed = append(rep.Removed, it)
		rep.FreedBytes += freed
	}
	rep.After = diskFacts(a.cfg.ContentRoot, a.log)
	if len(rep.Removed) > 0 {
		changeWatch{changed: a.factsChanged}.signal()
	}
	return rep
}

// evict removes one item and returns the bytes it freed.
func (a *Agent) evict(ctx context.Context, it schemas.DiskItem) (int64, error) {
	switch it.Kind {
	case schemas.DiskItemImage:
		res, err := a.rt.RemoveImage(ctx, it.ID)
		return res.Freed, err
	case schemas.DiskItemCache:
		name, key, _ := strings.Cut(it.ID, "/")
		c := a.caches()
		dir, marker := c.dirs(name, key)
		if err := os.RemoveAll(dir); err != nil {
			return 0, fmt.Errorf("remove cache %s: %w", it.ID, err)
		}
		if err := os.Remove(marker); err != nil && !errors.Is(err, os.ErrNotExist) {
			return it.SizeBytes, fmt.Errorf("remove cache %s's marker: %w", it.ID, err)
		}
		// The name's directory goes with its last key.
		_ = os.Remove(c.nameDir(name))
		return it.SizeBytes, nil
	case schemas.DiskItemArtifact:
		if a.artifacts == nil {
			return 0, errors.New("this node keeps no artifact replicas")
		}
		if err := a.artifacts.Remove(it.ID); err != nil {
			return 0, err
		}
		return it.SizeBytes, nil
	}
	return 0, fmt.Errorf("unknown disk item kind %q", it.Kind)
}

// diskSnapshot lists what the node holds and what is busy: images and
// caches of every workload the runtime holds (running or not yet removed),
// of every attempt prepared or launched and not yet ended (held), and
// what the control plane keeps.
// A collection (not a prune) leaves caches out when they live on another
// filesystem than the content root.
func (a *Agent) diskSnapshot(ctx context.Context, keep schemas.DiskKeep, disk schemas.DiskFacts, prune bool) (diskSnapshot, error) {
	s := diskSnapshot{Disk: disk, Busy: map[string]string{}, Keep: keepSet(keep)}
	workloads, err := a.rt.List(ctx)
	if err != nil {
		return s, fmt.Errorf("list workloads: %w", err)
	}
	for _, st := range workloads {
		why := "used by workload " + st.ID
		if st.ManifestDigest != "" {
			s.Busy[diskKey(schemas.DiskItemImage, st.ManifestDigest)] = why
		}
		for _, c := range strings.Split(st.Labels[LabelCaches], ",") {
			if c != "" {
				s.Busy[diskKey(schemas.DiskItemCache, c)] = "mounted by workload " + st.ID
			}
		}
		for _, d := range strings.Split(st.Labels[LabelArtifacts], ",") {
			if d != "" {
				s.Busy[diskKey(schemas.DiskItemArtifact, d)] = "mounted by workload " + st.ID
			}
		}
	}
	a.mu.Lock()
	for attempt, h := range a.held {
		if h.digest != "" && s.Busy[diskKey(schemas.DiskItemImage, h.digest)] == "" {
			s.Busy[diskKey(schemas.DiskItemImage, h.digest)] = "prepared for attempt " + attempt
		}
		for _, c := range h.caches {
			if s.Busy[diskKey(schemas.DiskItemCache, c)] == "" {
				s.Busy[diskKey(schemas.DiskItemCache, c)] = "mounted by attempt " + attempt
			}
		}
		for _, d := range h.artifacts {
			if s.Busy[diskKey(schemas.DiskItemArtifact, d)] == "" {
				s.Busy[diskKey(schemas.DiskItemArtifact, d)] = "prepared for attempt " + attempt
			}
		}
	}
	a.mu.Unlock()
	imgs, err := a.rt.ImageUsage(ctx)
	if err != nil {
		return s, fmt.Errorf("image usage: %w", err)
	}
	for _, im := range imgs {
		s.Items = append(s.Items, schemas.DiskItem{Kind: schemas.DiskItemImage, ID: im.ManifestDigest, SizeBytes: im.SizeBytes, LastUsedAt: im.LastUsedAt})
	}
	if a.artifacts != nil && (prune || sameFilesystem(a.cfg.ArtifactDir, a.cfg.ContentRoot)) {
		for _, r := range a.artifacts.List() {
			s.Items = append(s.Items, schemas.DiskItem{Kind: schemas.DiskItemArtifact, ID: r.Digest, SizeBytes: r.SizeBytes, LastUsedAt: r.LastUsedAt})
		}
	}
	if !prune && !sameFilesystem(a.cfg.CacheDir, a.cfg.ContentRoot) {
		// Removing these would free nothing on the disk being collected.
		return s, nil
	}
	for _, c := range a.caches().facts(ctx) {
		s.Items = append(s.Items, schemas.DiskItem{Kind: schemas.DiskItemCache, ID: schemas.CacheItemID(c.Name, c.CompatibilityKey),
			SizeBytes: c.SizeBytes, LastUsedAt: c.LastUsedAt})
	}
	return s, nil
}

// servePrune answers the control plane's prune requests on
// wf.node.<id>.disk.prune until stop is called; stop returns once no
// prune is in hand (cancel ctx first to cut one short).
func (a *Agent) servePrune(ctx context.Context) (stop func(), err error) {
	var (
		mu       sync.Mutex
		stopped  bool
		inflight sync.WaitGroup
	)
	sub, err := a.conn.NC.Subscribe(bus.NodeDiskPrune(a.cfg.NodeID), func(m *nats.Msg) {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		inflight.Add(1)
		mu.Unlock()
		defer inflight.Done()
		a.handlePrune(ctx, m)
	})
	if err != nil {
		return nil, fmt.Errorf("agent: subscribe %s: %w", bus.NodeDiskPrune(a.cfg.NodeID), err)
	}
	return func() {
		_ = sub.Unsubscribe()
		mu.Lock()
		stopped = true
		mu.Unlock()
		inflight.Wait()
	}, nil
}

func (a *Agent) handlePrune(ctx context.Context, m *nats.Msg) {
	var req schemas.DiskPrune
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = req.Validate()
	}
	enr := a.Enrollment()
	var ref *schemas.Refusal
	switch {
	case err != nil:
		ref = schemas.RefusalOfInput(err, "body is not a DiskPrune")
	case req.NodeID != a.cfg.NodeID:
		ref = &schemas.Refusal{Code: schemas.CodeWrongNode, Field: "node_id", Reason: "prune addressed to node " + req.NodeID}
	case req.FencingToken != enr.FencingToken:
		ref = &schemas.Refusal{Code: schemas.CodeStaleFencingToken, Field: "fencing_token",
			Reason: fmt.Sprintf("prune stamped with fencing token %d; this session holds %d", req.FencingToken, enr.FencingToken)}
	}
	if ref != nil {
		if err := bus.Respond(m, enc, schemas.Reply[schemas.PruneReport]{Refusal: ref}); err != nil {
			a.log.Warn("prune refusal not sent", zap.Error(err))
		}
		return
	}
	a.log.Info("prune requested", zap.Bool("dry_run", req.DryRun), zap.Int("kept_by_control_plane", len(req.Keep.Items)))
	rep := a.sweep(ctx, req.Keep, true, req.DryRun)
	if err := bus.Respond(m, enc, schemas.Reply[schemas.PruneReport]{OK: &rep}); err != nil {
		a.log.Warn("prune report not sent", zap.Error(err))
	}
}

// sameFilesystem says whether both paths are on one filesystem; false when
// either cannot be read.
func sameFilesystem(a, b string) bool {
	var sa, sb syscall.Stat_t
	if syscall.Stat(a, &sa) != nil || syscall.Stat(b, &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev
}
