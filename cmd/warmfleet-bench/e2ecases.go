package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/warmfleet/warmfleet/internal/ociimage"
)

// busyboxResult is the busybox cases: warm (the image present) and cold
// (a different image every Run), each side's.
type busyboxResult struct {
	directWarm, directCold []time.Duration
	warm, cold             *runTimings
}

// busyboxCases times the warm case, then the cold one.
func (b *e2eBench) busyboxCases(ctx context.Context) (*busyboxResult, error) {
	res := &busyboxResult{}
	var err error
	warm := func(int) ociimage.Image { return b.warm }
	if res.directWarm, res.warm, err = b.busyboxCase(ctx, "warm", warm, warm); err != nil {
		return nil, err
	}
	res.directCold, res.cold, err = b.busyboxCase(ctx, "cold",
		func(i int) ociimage.Image { return b.coldDirect[i] }, func(i int) ociimage.Image { return b.coldWF[i] })
	return res, err
}

// busyboxCase times o.runs launches of direct(i) and Runs of wf(i):
// direct and warmfleet alternate, run by run, so the machine's noise falls
// on both alike.
func (b *e2eBench) busyboxCase(ctx context.Context, name string, direct, wf func(i int) ociimage.Image) ([]time.Duration, *runTimings, error) {
	var directs []time.Duration
	runs := newRunTimings()
	for i := range b.o.runs {
		time.Sleep(b.o.gap)
		d, err := directLaunch(ctx, b.direct, imageSpec(direct(i)), "direct-"+name+"-"+strconv.Itoa(i), b.o.command)
		if err != nil {
			return nil, nil, err
		}
		directs = append(directs, d)
		time.Sleep(b.o.gap)
		end, err := b.runs.run(ctx, fmt.Sprintf("e2e-%s-%s-%03d", b.nonce, name, i), wf(i).Reference, nil)
		if err != nil {
			return nil, nil, err
		}
		runs.add(end)
	}
	return directs, runs, nil
}

// sizedCases stores the artifact, brings the image and artifact in over a
// fast link (untimed: so the first speed's warm case starts warm, and the
// direct side's), then measures every case at each link speed.
func (b *e2eBench) sizedCases(ctx context.Context) ([]*sizedResult, error) {
	rec, err := putArtifact(ctx, b.client, b.o.sized.artifactMiB)
	if err != nil {
		return nil, err
	}
	b.art = benchArtifact{rec: rec, storeDir: filepath.Join(b.agentCfg.DataDir, "artifacts")}
	sr := &sizedRun{o: b.o.sized, gap: b.o.gap, nonce: b.nonce, cd: b.cd, direct: b.direct, world: b.world, art: b.art, via: b.via, rt: b.rt,
		runs: b.runs, command: b.o.command}
	b.world.link.setRate(100_000)
	if _, err := b.runs.run(ctx, "e2e-"+b.nonce+"-sized-warmup", b.world.a.via.String(), sr.uses()); err != nil {
		return nil, fmt.Errorf("sized warm-up run: %w", err)
	}
	if _, err := directLaunch(ctx, b.direct, b.world.directSpec(b.world.a), "direct-sized-warmup", b.o.command); err != nil {
		return nil, fmt.Errorf("direct sized warm-up: %w", err)
	}
	var sized []*sizedResult
	for _, mbit := range b.links {
		res, err := sr.run(ctx, mbit)
		if err != nil {
			return nil, fmt.Errorf("at %d Mbit/s: %w", mbit, err)
		}
		sized = append(sized, res)
	}
	return sized, nil
}

func (b *e2eBench) report(busy *busyboxResult, sized []*sizedResult) (*Report, error) {
	rep := newReport("e2e")
	dw, dc := summarise(busy.directWarm), summarise(busy.directCold)
	ws, cs := summarise(busy.warm.submitToRunning), summarise(busy.cold.submitToRunning)
	rep.add("warm: submit → running p50", ws.P50, "ms", dw.P50, "containerd adapter direct, warm p50")
	rep.add("cold: submit → running p50", cs.P50, "ms", dc.P50, "containerd adapter direct, cold p50")
	rep.add("cold − warm p50 (image import + unpack)", cs.P50-ws.P50, "ms", dc.P50-dw.P50, "direct cold − warm")
	rep.Details["warm_stages"] = busy.warm.stages()
	rep.Details["cold_stages"] = busy.cold.stages()
	rep.Details["direct_warm"] = dw
	rep.Details["direct_cold"] = dc
	rep.note("warm stages p50: %s", stageTable(busy.warm.stages()))
	rep.note("cold stages p50: %s", stageTable(busy.cold.stages()))
	rep.note("%d Runs per case, one at a time, %s apart, alternating direct and warmfleet; command %q; image %d-byte OCI archive of busybox-static", b.o.runs, b.o.gap, b.o.command, b.warm.SizeBytes)
	if b.world == nil {
		return rep, nil
	}
	reportSized(rep, b.o.sized, b.world, b.art, sized)
	creds, _, failed := b.images.snapshot()
	if failed > 0 {
		return nil, fmt.Errorf("%d registry credential asks failed", failed)
	}
	cr := summarise(creds)
	rep.Details["registry_credential_asks"] = cr
	rep.note("registry credential asks: %d, p50 %.2f ms (one per pull that fetched)", cr.N, cr.P50)
	return rep, nil
}
