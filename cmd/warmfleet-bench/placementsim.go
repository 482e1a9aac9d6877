package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/controlplane/placement"
)

// newPlacementSimCmd is the placement study: the real placement.Decide
// against the policies users would otherwise run, over a simulated fleet
// driven by the committed trace corpus.
func newPlacementSimCmd(g *globals) *cobra.Command {
	var traces, policies []string
	var reseed int
	var wholeNode, gpuHour float64
	cmd := &cobra.Command{
		Use:   "placement-sim",
		Short: "Simulate placement policies (warmfleet, random, least-allocated, bin-pack, image-locality) over a trace corpus",
		Long: `placement-sim runs the control plane's placement (placement.Decide, default
config) over a simulated fleet — nodes with GPUs and disks, layer pulls at a
link's bandwidth plus unpack, artifact fetches, collection between disk
watermarks, Runs holding their cards for a duration — and the same traces
under random, least-allocated (Kubernetes' default spread), bin-pack (Nomad's
default) and Kubernetes' ImageLocality. Without --trace it runs the committed
corpus. Per policy: time-to-start percentiles, queueing delay, bytes pulled,
GPU-hours held while bytes arrive. --reseed N also runs each trace with N
other seeds: the same shape, other draws, to tell a placement change from
the luck of one seed.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if reseed < 0 || reseed > maxReseed {
				return fmt.Errorf("--reseed %d: want 0 to %d", reseed, maxReseed)
			}
			cfg := placement.DefaultConfig()
			if cmd.Flags().Changed("whole-node-seconds") {
				cfg.WholeNodeSeconds = wholeNode
			}
			if cmd.Flags().Changed("gpu-hour-price") {
				cfg.GPUHourPrice = gpuHour
			}
			rep, err := placementSim(cmd.Context(), traces, policies, reseed, cfg)
			if err != nil {
				return err
			}
			if g.output != "json" {
				results, _ := rep.Details["traces"].([]simTraceResult)
				if err := printSimTables(cmd.OutOrStdout(), results); err != nil {
					return err
				}
			}
			return rep.print(cmd.OutOrStdout(), g.output)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&traces, "trace", nil, "trace files to run (default: the committed corpus)")
	f.IntVar(&reseed, "reseed", 0, fmt.Sprintf("also run each trace with this many other seeds (seed×1000+k, named TRACE-sK), up to %d", maxReseed))
	f.Float64Var(&wholeNode, "whole-node-seconds", placement.DefaultConfig().WholeNodeSeconds, "warmfleet's price for breaking a whole free node (placement.Config.WholeNodeSeconds; 0 or less: none), to A/B it")
	f.Float64Var(&gpuHour, "gpu-hour-price", 0, "warmfleet's price of a card held idle while bytes arrive, USD per GPU-hour (placement.Config.GPUHourPrice; 0: placement's default, negative: none), to A/B it")
	f.StringSliceVar(&policies, "policies", nil, "policies to run (default: all of warmfleet, random, least-allocated, bin-pack, image-locality)")
	return cmd
}

// maxReseed bounds --reseed: each seed is another full run of every trace.
const maxReseed = 20

// placementSim runs every policy over every trace (and reseed variants of
// each) and states the two goals against the other policies in
// the same run.
func placementSim(ctx context.Context, traceFiles, policyNames []string, reseed int, cfg placement.Config) (*Report, error) {
	traces, err := loadTraces(traceFiles, os.ReadFile)
	if err != nil {
		return nil, err
	}
	traces = withSeeds(traces, reseed)
	all := simPolicies(cfg)
	var chosen []simPolicy
	for _, p := range all {
		if len(policyNames) == 0 || slices.Contains(policyNames, p.name()) {
			chosen = append(chosen, p)
		}
	}
	if len(chosen) == 0 {
		return nil, fmt.Errorf("--policies %s: none known; use %s", strings.Join(policyNames, ","), strings.Join(policyNamesOf(all), ", "))
	}
	rep := newReport("placement-sim")
	var results []simTraceResult
	for _, t := range traces {
		tr, err := runTrace(ctx, t, chosen, cfg)
		if err != nil {
			return nil, err
		}
		results = append(results, tr)
		addSimGoals(rep, tr)
	}
	if reseed > 0 {
		addSeedSummary(rep, results)
	}
	rep.Details["traces"] = results
	rep.note("time-to-start is submit → running; queue delay is submit → cards held; GPU-h pull wait is cards held while bytes arrive, or kept free for a Run fetching its bytes first (KEPT)")
	return rep, nil
}

// withSeeds appends, after each trace, n copies drawn from other seeds.
func withSeeds(traces []*simTrace, n int) []*simTrace {
	out := make([]*simTrace, 0, len(traces)*(n+1))
	for _, t := range traces {
		out = append(out, t)
		for k := 1; k <= n; k++ {
			c := *t // expand only reads the trace, so the copies share its slices
			c.Seed, c.Name = t.Seed*1000+uint64(k), fmt.Sprintf("%s-s%d", t.Name, k)
			out = append(out, &c)
		}
	}
	return out
}

// addSeedSummary counts the traces, reseeded ones included, on which
// warmfleet's p95 time-to-start is the lowest, on which its GPU-hours
// waiting on pulls are the lowest, and on which both are, with the
// geometric mean of each ratio to the best other policy's.
func addSeedSummary(rep *Report, results []simTraceResult) {
	var p95Wins, gpuhWins, both, n int
	var p95Log, gpuhLog float64
	for _, tr := range results {
		rp, okP := ratioToBest(tr, p95Of)
		rg, okG := ratioToBest(tr, pullWaitOf)
		if !okP || !okG {
			continue
		}
		n++
		p95Log, gpuhLog = p95Log+math.Log(rp), gpuhLog+math.Log(rg)
		if rp <= 1 {
			p95Wins++
		}
		if rg <= 1 {
			gpuhWins++
		}
		if rp <= 1 && rg <= 1 {
			both++
		}
	}
	if n > 0 {
		rep.add("all seeds: traces where warmfleet's p95 is lowest", float64(p95Wins), "", float64(n), "traces")
		rep.add("all seeds: warmfleet p95 / best other's, geometric mean", math.Exp(p95Log/float64(n)), "×", 1, "parity")
		rep.add("all seeds: traces where warmfleet's GPU-h pull wait is lowest", float64(gpuhWins), "", float64(n), "traces")
		rep.add("all seeds: warmfleet GPU-h pull wait / lowest other's, geometric mean", math.Exp(gpuhLog/float64(n)), "×", 1, "parity")
		rep.add("all seeds: traces where both are lowest", float64(both), "", float64(n), "traces")
	}
}

// ratioToBest is warmfleet's figure on tr over the lowest other policy's;
// ok is false when either is missing or not positive.
func ratioToBest(tr simTraceResult, figure func(simResult) float64) (float64, bool) {
	wf, ok := tr.policy("warmfleet")
	best, ok2 := lowestOther(tr, figure)
	if !ok || !ok2 || figure(best) <= 0 || figure(wf) <= 0 {
		return 0, false
	}
	return figure(wf) / figure(best), true
}

// p95Of and pullWaitOf are the two figures the goals compare.
func p95Of(r simResult) float64      { return r.TimeToStart.P95 }
func pullWaitOf(r simResult) float64 { return r.GPUHoursPullWait }

// lowestOther is the policy other than warmfleet with the lowest figure
// on tr (the first of equals); ok is false when there is none.
func lowestOther(tr simTraceResult, figure func(simResult) float64) (simResult, bool) {
	var best simResult
	ok := false
	for _, p := range tr.Policies {
		if p.Policy != "warmfleet" && (!ok || figure(p) < figure(best)) {
			best, ok = p, true
		}
	}
	return best, ok
}

func policyNamesOf(ps []simPolicy) []string {
	var names []string
	for _, p := range ps {
		names = append(names, p.name())
	}
	return names
}

// runTrace simulates each policy on one trace.
func runTrace(ctx context.Context, t *simTrace, policies []simPolicy, cfg placement.Config) (simTraceResult, error) {
	tr := simTraceResult{Trace: t.Name, Description: t.Description, Nodes: t.Fleet.Nodes, GPUs: t.Fleet.Nodes * t.Fleet.GPUsPerNode, Runs: t.Workload.Runs,
		FloorBytes: t.floorBytes()}
	for _, p := range policies {
		s := newSimulator(t, p, cfg)
		if err := s.run(ctx); err != nil {
			return tr, err
		}
		tr.Policies = append(tr.Policies, s.result())
	}
	return tr, nil
}

// addSimGoals states the goals for one trace: warmfleet's p95
// time-to-start the lowest of all policies, its GPU-hours waiting on pulls
// at or below every other's, and on the Zipf trace at most half the bytes
// ImageLocality pulls.
func addSimGoals(rep *Report, tr simTraceResult) {
	wf, ok := tr.policy("warmfleet")
	if !ok {
		return
	}
	if best, ok := lowestOther(tr, p95Of); ok {
		rep.add(tr.Trace+": warmfleet p95 time-to-start", wf.TimeToStart.P95, "s", best.TimeToStart.P95, "best other: "+best.Policy).
			goal("lowest of all policies", wf.TimeToStart.P95 <= best.TimeToStart.P95)
	}
	if least, ok := lowestOther(tr, pullWaitOf); ok {
		rep.add(tr.Trace+": warmfleet GPU-h waiting on pulls", wf.GPUHoursPullWait, "GPU-h", least.GPUHoursPullWait, "lowest other: "+least.Policy).
			goal("≤ every other policy's", wf.GPUHoursPullWait <= least.GPUHoursPullWait)
	}
	if il, ok := tr.policy("image-locality"); ok && strings.HasPrefix(tr.Trace, "zipf") && il.BytesPulled() > 0 {
		rep.add(tr.Trace+": warmfleet bytes pulled", gb(wf.BytesPulled()), "GB", gb(il.BytesPulled()), "image-locality").
			goal("≤ 0.5×", float64(wf.BytesPulled()) <= 0.5*float64(il.BytesPulled()))
	}
}
