package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// sizedRun is everything the production-sized cases need from runE2E.
type sizedRun struct {
	o      sizedOpts
	gap    time.Duration
	nonce  string
	cd     *benchContainerd
	direct *containerd.Runtime
	world  *sizedWorld
	art    benchArtifact
	// via is a bench connection through the link, for the artifact's
	// transfer floor.
	via     *bus.Conn
	rt      *timedRuntime
	runs    *e2eRunner
	command []string
}

// sizedResult is one link speed's cases.
type sizedResult struct {
	Mbit            int
	AchievedMbit    float64 // the link check's rate
	RawImageMbit    float64 // the floor's last raw transfer's rate
	warm, part, cld *sizedCase
}

func (s *sizedRun) uses() []schemas.ArtifactUse {
	return []schemas.ArtifactUse{{Name: s.art.rec.Name, Version: s.art.rec.Version, Path: "/data/weights"}}
}

// mount is the artifact as the agent mounts it, for the direct floor: the
// agent's own replica, read-only.
func (s *sizedRun) mount() noderuntime.Mount {
	return noderuntime.Mount{Source: filepath.Join(s.art.storeDir, "blobs", "sha256", strings.TrimPrefix(s.art.rec.Digest, "sha256:")), Target: "/data/weights", ReadOnly: true}
}

// runsOf is how many Runs case name gets: none when it is not measured.
func (s *sizedRun) runsOf(name string) int {
	if !s.o.has(name) {
		return 0
	}
	return s.o.runs
}

// run measures every case at one link speed: warm, partial, then cold
// (which leaves image a and the artifact present for the next speed's warm).
func (s *sizedRun) run(ctx context.Context, mbit int) (*sizedResult, error) {
	s.world.link.setRate(mbit)
	res := &sizedResult{Mbit: mbit, warm: newSizedCase(), part: newSizedCase(), cld: newSizedCase()}
	check := min(int64(3*s.world.link.bytesPerSecond()), 512<<20)
	took, err := measureLink(ctx, s.world.link, check)
	if err != nil {
		return nil, fmt.Errorf("link check: %w", err)
	}
	res.AchievedMbit = float64(check) * 8 / 1e6 / took.Seconds()
	for _, c := range []func(context.Context, *sizedResult) error{s.warm, s.partial, s.cold} {
		if err := c(ctx, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// warm: image a and the artifact present; the floor is the adapter's
// launch, timed before each Run.
func (s *sizedRun) warm(ctx context.Context, res *sizedResult) error {
	a := s.world.a
	for i := range s.runsOf("warm") {
		time.Sleep(s.gap)
		d, err := directLaunch(ctx, s.direct, s.world.directSpec(a), fmt.Sprintf("direct-%d-warm-%d", res.Mbit, i), s.command, s.mount())
		if err != nil {
			return fmt.Errorf("direct warm: %w", err)
		}
		res.warm.floor, res.warm.direct = append(res.warm.floor, d), append(res.warm.direct, d)
		time.Sleep(s.gap)
		if err := s.timed(ctx, res.warm, res.Mbit, fmt.Sprintf("warm-%d", i), a.via.String()); err != nil {
			return fmt.Errorf("warm run: %w", err)
		}
	}
	return nil
}

// partial: variant b's own layers dropped, its base and the artifact
// present.
func (s *sizedRun) partial(ctx context.Context, res *sizedResult) error {
	b := s.world.b
	base := len(b.img.layers) - len(b.img.top)
	for i := range s.runsOf("partial") {
		top, shared := layersOf(b.img, base), layersOf(b.img, 0)[:base]
		if err := dropAndCheck(ctx, s.cd.Address, []digest.Digest{digest.Digest(b.direct.Digest)}, top, shared, s.namespaces()...); err != nil {
			return fmt.Errorf("partial drop: %w", err)
		}
		time.Sleep(s.gap)
		if err := s.timed(ctx, res.part, res.Mbit, fmt.Sprintf("partial-%d", i), b.via.String()); err != nil {
			return fmt.Errorf("partial run: %w", err)
		}
		if err := s.floor(ctx, res, res.part, fmt.Sprintf("%d-partial-%d", res.Mbit, i), b, top, false); err != nil {
			return fmt.Errorf("partial floor: %w", err)
		}
	}
	return nil
}

// cold: both images' layers (but the busybox root the busybox cases'
// images hold too) and the artifact replica removed before each Run.
func (s *sizedRun) cold(ctx context.Context, res *sizedResult) error {
	a, b := s.world.a, s.world.b
	root, base := s.world.fam.rootLayers, len(b.img.layers)-len(b.img.top)
	for i := range s.runsOf("cold") {
		all := append(layersOf(a.img, root), layersOf(b.img, base)...)
		if err := dropAndCheck(ctx, s.cd.Address, []digest.Digest{digest.Digest(a.direct.Digest), digest.Digest(b.direct.Digest)}, all, nil, s.namespaces()...); err != nil {
			return fmt.Errorf("cold drop: %w", err)
		}
		if err := s.art.removeReplica(); err != nil {
			return fmt.Errorf("cold artifact removal: %w", err)
		}
		time.Sleep(s.gap)
		if err := s.timed(ctx, res.cld, res.Mbit, fmt.Sprintf("cold-%d", i), a.via.String()); err != nil {
			return fmt.Errorf("cold run: %w", err)
		}
		if err := s.floor(ctx, res, res.cld, fmt.Sprintf("%d-cold-%d", res.Mbit, i), a, layersOf(a.img, root), true); err != nil {
			return fmt.Errorf("cold floor: %w", err)
		}
	}
	return nil
}

// namespaces are the agent's and the direct side's.
func (s *sizedRun) namespaces() []string { return []string{s.cd.Namespace, s.cd.Namespace + "-direct"} }

// timed runs one Run mounting the artifact and adds it, split into stages
// by the agent's runtime calls, to case c.
func (s *sizedRun) timed(ctx context.Context, c *sizedCase, mbit int, name, image string) error {
	end, err := s.runs.run(ctx, fmt.Sprintf("e2e-%s-%d-%s", s.nonce, mbit, name), image, s.uses())
	if err != nil {
		return err
	}
	ensure, launch, ok := s.rt.since(end.submitted)
	if !ok {
		return fmt.Errorf("run %s: no image ensure and launch seen", name)
	}
	c.addRun(end, ensure, launch)
	if s.rt.inventoryDuring(launch) {
		c.factsDuring++
	}
	return nil
}

// floor is the transfer of the bytes the Run had to fetch, through the
// same link, then the adapter's unpack and start on this machine.
func (s *sizedRun) floor(ctx context.Context, res *sizedResult, c *sizedCase, name string, ref sizedRef, blobs []familyLayer, artifact bool) error {
	time.Sleep(s.gap)
	start := time.Now()
	n, err := s.world.rawBlobs(ctx, blobs)
	if err != nil {
		return err
	}
	if artifact {
		m, err := rawArtifact(ctx, s.via, s.art.rec.Source.Object)
		if err != nil {
			return err
		}
		n += m
	}
	raw := time.Since(start)
	if n > 0 {
		res.RawImageMbit = float64(n) * 8 / 1e6 / raw.Seconds()
	}
	d, err := directLaunch(ctx, s.direct, s.world.directSpec(ref), "direct-"+name, s.command, s.mount())
	if err != nil {
		return fmt.Errorf("direct %s: %w", name, err)
	}
	c.raw, c.direct, c.floor = append(c.raw, raw), append(c.direct, d), append(c.floor, raw+d)
	return nil
}

// reportSized adds each speed's cases: p50 against the floor's p50, p95s,
// the stages, and the link's achieved rate.
func reportSized(rep *Report, o sizedOpts, w *sizedWorld, art benchArtifact, res []*sizedResult) {
	a, b := w.a.img, w.b.img
	rep.note("sized: image %d MiB random in %d gzip layers (%d shared with the partial variant) on busybox, %.0f MiB compressed; partial fetches %.0f MiB; artifact %.0f MiB; %d Runs per case per speed, alternating with the floor",
		o.imageMiB, o.layers, o.baseLayers, float64(a.bytes)/(1<<20), float64(b.topBytes)/(1<<20), float64(art.rec.SizeBytes)/(1<<20), o.runs)
	var details []map[string]any
	for _, r := range res {
		rep.note("link %d Mbit/s: check %.0f Mbit/s through the link; the floor's raw transfer %.0f Mbit/s", r.Mbit, r.AchievedMbit, r.RawImageMbit)
		d := map[string]any{"link_mbit": r.Mbit, "link_check_mbit": r.AchievedMbit, "raw_transfer_mbit": r.RawImageMbit}
		for _, c := range []struct {
			name, goal string
			limit      float64
			c          *sizedCase
		}{{"warm", "≤ 1.1", 1.1, r.warm}, {"partial", "", 0, r.part}, {"cold", "≤ 1.2", 1.2, r.cld}} {
			if !o.has(c.name) {
				continue
			}
			p50, f50 := pct(c.c.total, 0.5), pct(c.c.floor, 0.5)
			row := rep.add(fmt.Sprintf("%s @ %d Mbit/s: submit → running p50", c.name, r.Mbit), p50, "ms", f50, "floor p50: raw transfer + adapter unpack + start")
			if c.limit > 0 && f50 > 0 {
				row.goal(c.goal, p50/f50 <= c.limit)
			}
			stages := map[string]Latencies{}
			var parts []string
			for _, k := range sizedStages {
				if v, ok := c.c.stages[k]; ok {
					stages[k] = summarise(v)
					parts = append(parts, fmt.Sprintf("%s %.0f", k, pct(v, 0.5)))
				}
			}
			rep.note("%s @ %d: p95 %.0f ms vs floor p95 %.0f ms; median of each Run over its own floor %.2f; floor p50 = raw %.0f + direct %.0f ms; stages p50 (ms): %s; the agent measured facts during %d of its %d launches",
				c.name, r.Mbit, pct(c.c.total, 0.95), pct(c.c.floor, 0.95), c.c.pairedRatio(), pct(c.c.raw, 0.5), pct(c.c.direct, 0.5), strings.Join(parts, ", "),
				c.c.factsDuring, len(c.c.total))
			d[c.name] = map[string]any{"submit_to_running": summarise(c.c.total), "p95_ms": pct(c.c.total, 0.95), "paired_ratio_p50": c.c.pairedRatio(),
				"floor": summarise(c.c.floor), "floor_p95_ms": pct(c.c.floor, 0.95), "floor_raw": summarise(c.c.raw), "floor_direct": summarise(c.c.direct), "stages": stages,
				"facts_during_launch": c.c.factsDuring}
		}
		details = append(details, d)
	}
	rep.Details["sized"] = details
}
