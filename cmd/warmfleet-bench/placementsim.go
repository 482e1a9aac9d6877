package main

import (
	"context"
	"fmt"
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
GPU-hours held while bytes arrive.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := placementSim(cmd.Context(), traces, policies)
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
	f.StringSliceVar(&policies, "policies", nil, "policies to run (default: all of warmfleet, random, least-allocated, bin-pack, image-locality)")
	return cmd
}

// placementSim runs every policy over every trace and states the issue's
// two goals against the other policies in the same run.
func placementSim(ctx context.Context, traceFiles, policyNames []string) (*Report, error) {
	traces, err := loadTraces(traceFiles, os.ReadFile)
	if err != nil {
		return nil, err
	}
	cfg := placement.DefaultConfig()
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
	rep.Details["traces"] = results
	rep.note("time-to-start is submit → running; queue delay is submit → cards held; GPU-h pull wait is cards held while bytes arrive")
	return rep, nil
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
// time-to-start the lowest of all policies, and on the Zipf trace at most
// half the bytes ImageLocality pulls.
func addSimGoals(rep *Report, tr simTraceResult) {
	wf, ok := tr.policy("warmfleet")
	if !ok {
		return
	}
	best, bestName := 0.0, ""
	for _, p := range tr.Policies {
		if p.Policy != "warmfleet" && (bestName == "" || p.TimeToStart.P95 < best) {
			best, bestName = p.TimeToStart.P95, p.Policy
		}
	}
	if bestName != "" {
		rep.add(tr.Trace+": warmfleet p95 time-to-start", wf.TimeToStart.P95, "s", best, "best other: "+bestName).
			goal("lowest of all policies", wf.TimeToStart.P95 <= best)
	}
	if il, ok := tr.policy("image-locality"); ok && strings.HasPrefix(tr.Trace, "zipf") && il.BytesPulled() > 0 {
		rep.add(tr.Trace+": warmfleet bytes pulled", gb(wf.BytesPulled()), "GB", gb(il.BytesPulled()), "image-locality").
			goal("≤ 0.5×", float64(wf.BytesPulled()) <= 0.5*float64(il.BytesPulled()))
	}
}
