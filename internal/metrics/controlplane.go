package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmfleet/warmfleet/schemas"
)

// ControlPlane is a snapshot of a control-plane replica's counters and of
// the Runs its cache holds, by phase. The control plane fills it (its
// Metrics method; controlplane.Metrics is this type) and the collectors
// read it, so this package needs nothing from the control plane itself.
type ControlPlane struct {
	Transitions, FencedObservations, Rejected, StaleReports, LeaseLapses, CommandsSent, PlacementMisses int64
	Decisions, DecisionNanos                                                                            int64
	// Passes counts scheduling passes; a pass decides only the waiting Runs
	// whose fleet changed.
	Passes int64
	// DecidedAtIntake counts Runs stored with their first decision at
	// intake, which the scheduler then had no write to make for.
	DecidedAtIntake int64
	// Heartbeats counts heartbeats that extended a lease; EventsPublished
	// counts Run event publishes (including repairs that dedupe dropped).
	Heartbeats, EventsPublished int64
	// RefusedObservations counts receipts and workload reports a node's
	// current session sent about an attempt booked on another node.
	RefusedObservations int64
	// RunsRemoved counts ended Runs this replica purged from wf_runs once
	// past their retention.
	RunsRemoved int64
	// PolicyReloadFailures counts changed scheduling policy files that did
	// not load (the policy last read was kept).
	PolicyReloadFailures int64
	// CachedRuns is how many Runs the replica holds in memory: the active
	// ones, and ended ones for the moment until their watch update is read.
	CachedRuns int

	// Phases counts the active Runs in wf_runs by phase, as the replica's
	// cache holds them (it holds no ended Run). It means something only when PhasesSynced is true: the
	// cache has taken in every Run wf_runs held when its watch started, and
	// follows the bucket from there. Until then the Runs gauge is left out
	// rather than reported low.
	Phases       map[schemas.Phase]int
	PhasesSynced bool

	// Cost is what Runs cost and the tenants' budgets (cost.go).
	Cost Cost
}

// cpCounter is one control-plane counter: its description and how to read
// it from a snapshot.
type cpCounter struct {
	desc  *prometheus.Desc
	value func(ControlPlane) float64
}

func cpDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "controlplane", name), help, nil, nil)
}

// ControlPlaneCollector exposes ControlPlane snapshots: the counters, and
// the Runs by phase as a gauge. It takes one snapshot per scrape, so the
// metrics of one scrape are consistent with each other as far as the
// snapshot is.
type ControlPlaneCollector struct {
	snapshot func() ControlPlane
	counters []cpCounter
}

// NewControlPlaneCollector reads snapshot (normally the control plane's
// Metrics method) at every scrape, so it must be cheap.
//
// Placement latency is exposed as two counters, decisions and the seconds
// they took in total: rate(seconds_total) / rate(decisions_total) is the
// mean time per decision over the window.
func NewControlPlaneCollector(snapshot func() ControlPlane) *ControlPlaneCollector {
	i := func(f func(ControlPlane) int64) func(ControlPlane) float64 {
		return func(m ControlPlane) float64 { return float64(f(m)) }
	}
	return &ControlPlaneCollector{snapshot: snapshot, counters: []cpCounter{
		{cpDesc("run_transitions_total", "Run phase changes written to wf_runs."),
			i(func(m ControlPlane) int64 { return m.Transitions })},
		{cpDesc("fenced_observations_total", "Reports, heartbeats and renewals dropped because they came from a superseded session or generation."),
			i(func(m ControlPlane) int64 { return m.FencedObservations })},
		{cpDesc("refused_observations_total", "Receipts and workload reports refused because they named an attempt booked on another node (attempt_not_booked_here)."),
			i(func(m ControlPlane) int64 { return m.RefusedObservations })},
		{cpDesc("rejected_requests_total", "Run requests refused with a coded rejected event."),
			i(func(m ControlPlane) int64 { return m.Rejected })},
		{cpDesc("stale_reports_total", "Workload reports that would have moved a Run backwards or changed nothing, and were ignored."),
			i(func(m ControlPlane) int64 { return m.StaleReports })},
		{cpDesc("lease_lapses_total", "Nodes marked lost because their lease lapsed."),
			i(func(m ControlPlane) int64 { return m.LeaseLapses })},
		{cpDesc("commands_sent_total", "Commands published to nodes on WF_CMDS."),
			i(func(m ControlPlane) int64 { return m.CommandsSent })},
		{cpDesc("placement_misses_total", "Placement decisions that found no node for the Run."),
			i(func(m ControlPlane) int64 { return m.PlacementMisses })},
		{cpDesc("placement_decisions_total", "Placement decisions taken."),
			i(func(m ControlPlane) int64 { return m.Decisions })},
		{cpDesc("runs_removed_total", "Ended Runs purged from wf_runs once past their retention, by this replica."),
			i(func(m ControlPlane) int64 { return m.RunsRemoved })},
		{prometheus.NewDesc(prometheus.BuildFQName(Namespace, "policy", "reload_failures_total"),
			"Changed scheduling policy files that did not load (invalid, unreadable or gone); the policy last read stays, and the control plane's log says why.", nil, nil),
			i(func(m ControlPlane) int64 { return m.PolicyReloadFailures })},
		{cpDesc("placement_decision_seconds_total", "Seconds spent taking placement decisions, in total; divide its rate by the rate of placement_decisions_total for the mean."),
			func(m ControlPlane) float64 { return float64(m.DecisionNanos) / 1e9 }},
	}}
}

// Describe implements prometheus.Collector.
func (c *ControlPlaneCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, k := range c.counters {
		ch <- k.desc
	}
	ch <- runsDesc
	ch <- cachedRunsDesc
	describeCost(ch)
}

var cachedRunsDesc = cpDesc("cached_runs", "Runs this replica holds in memory: the active ones (ended Runs leave it).")

// Collect implements prometheus.Collector.
func (c *ControlPlaneCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.snapshot()
	for _, k := range c.counters {
		ch <- prometheus.MustNewConstMetric(k.desc, prometheus.CounterValue, k.value(m))
	}
	ch <- prometheus.MustNewConstMetric(cachedRunsDesc, prometheus.GaugeValue, float64(m.CachedRuns))
	if m.PhasesSynced {
		collectPhases(ch, m.Phases)
	}
	collectCost(ch, m.Cost, m.PhasesSynced)
}

// Phases lists every Run phase, in lifecycle order; the Runs-by-phase gauge
// always has one series for each.
var Phases = []schemas.Phase{
	schemas.PhaseAccepted, schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning,
	schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost,
}

var runsDesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "runs"),
	"Active Runs in wf_runs, by phase; ended Runs are not held in memory, so their phases read 0 (count them with runs_removed_total and WF_EVENTS). Every control-plane replica reports the same numbers: aggregate with max, not sum.", []string{"phase"}, nil)

// collectPhases sends the Runs-by-phase gauge: one series for every phase
// in Phases, zero when no Run is in it, and one for any other phase counts
// holds.
func collectPhases(ch chan<- prometheus.Metric, counts map[schemas.Phase]int) {
	seen := make(map[schemas.Phase]bool, len(Phases))
	for _, p := range Phases {
		seen[p] = true
		ch <- prometheus.MustNewConstMetric(runsDesc, prometheus.GaugeValue, float64(counts[p]), string(p))
	}
	// A phase this build does not know (a newer control plane wrote it)
	// still shows.
	for p, n := range counts {
		if !seen[p] {
			ch <- prometheus.MustNewConstMetric(runsDesc, prometheus.GaugeValue, float64(n), string(p))
		}
	}
}
