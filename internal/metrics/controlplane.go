package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/schemas"
)

// cpCounter is one control-plane counter: its description and how to read
// it from a snapshot.
type cpCounter struct {
	desc  *prometheus.Desc
	value func(controlplane.Metrics) float64
}

func cpDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "controlplane", name), help, nil, nil)
}

// ControlPlaneCollector exposes controlplane.ControlPlane.Metrics() as
// counters. It takes one snapshot per scrape, so the counters of one scrape
// are consistent with each other as far as the snapshot is.
type ControlPlaneCollector struct {
	snapshot func() controlplane.Metrics
	counters []cpCounter
}

// NewControlPlaneCollector reads snapshot (normally cp.Metrics) at every
// scrape.
//
// Placement latency is exposed as two counters, decisions and the seconds
// they took in total: rate(seconds_total) / rate(decisions_total) is the
// mean time per decision over the window.
func NewControlPlaneCollector(snapshot func() controlplane.Metrics) *ControlPlaneCollector {
	i := func(f func(controlplane.Metrics) int64) func(controlplane.Metrics) float64 {
		return func(m controlplane.Metrics) float64 { return float64(f(m)) }
	}
	return &ControlPlaneCollector{snapshot: snapshot, counters: []cpCounter{
		{cpDesc("run_transitions_total", "Run phase changes written to wf_runs."),
			i(func(m controlplane.Metrics) int64 { return m.Transitions })},
		{cpDesc("fenced_observations_total", "Reports, heartbeats and renewals dropped because they came from a superseded session or generation."),
			i(func(m controlplane.Metrics) int64 { return m.FencedObservations })},
		{cpDesc("rejected_requests_total", "Run requests refused with a coded rejected event."),
			i(func(m controlplane.Metrics) int64 { return m.Rejected })},
		{cpDesc("stale_reports_total", "Workload reports that would have moved a Run backwards or changed nothing, and were ignored."),
			i(func(m controlplane.Metrics) int64 { return m.StaleReports })},
		{cpDesc("lease_lapses_total", "Nodes marked lost because their lease lapsed."),
			i(func(m controlplane.Metrics) int64 { return m.LeaseLapses })},
		{cpDesc("commands_sent_total", "Commands published to nodes on WF_CMDS."),
			i(func(m controlplane.Metrics) int64 { return m.CommandsSent })},
		{cpDesc("placement_misses_total", "Placement decisions that found no node for the Run."),
			i(func(m controlplane.Metrics) int64 { return m.PlacementMisses })},
		{cpDesc("placement_decisions_total", "Placement decisions taken."),
			i(func(m controlplane.Metrics) int64 { return m.Decisions })},
		{cpDesc("placement_decision_seconds_total", "Seconds spent taking placement decisions, in total; divide its rate by the rate of placement_decisions_total for the mean."),
			func(m controlplane.Metrics) float64 { return float64(m.DecisionNanos) / 1e9 }},
	}}
}

// Describe implements prometheus.Collector.
func (c *ControlPlaneCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, k := range c.counters {
		ch <- k.desc
	}
}

// Collect implements prometheus.Collector.
func (c *ControlPlaneCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.snapshot()
	for _, k := range c.counters {
		ch <- prometheus.MustNewConstMetric(k.desc, prometheus.CounterValue, k.value(m))
	}
}

// Phases lists every Run phase, in lifecycle order; the Runs-by-phase gauge
// always has one series for each.
var Phases = []schemas.Phase{
	schemas.PhaseAccepted, schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning,
	schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost,
}

var runsDesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "runs"),
	"Runs in wf_runs, by phase. It counts the whole bucket, so every control-plane replica reports the same numbers: aggregate with max, not sum.", []string{"phase"}, nil)

// RunPhaseCollector exposes the Runs by phase as a gauge.
type RunPhaseCollector struct {
	phases func() (map[schemas.Phase]int, bool)
}

// NewRunPhaseCollector reads phases at every scrape; it must be cheap (see
// RunPhases). While phases reports false (not yet synced), the gauge is left
// out rather than reported low.
func NewRunPhaseCollector(phases func() (map[schemas.Phase]int, bool)) *RunPhaseCollector {
	return &RunPhaseCollector{phases: phases}
}

// Describe implements prometheus.Collector.
func (c *RunPhaseCollector) Describe(ch chan<- *prometheus.Desc) { ch <- runsDesc }

// Collect implements prometheus.Collector.
func (c *RunPhaseCollector) Collect(ch chan<- prometheus.Metric) {
	counts, ok := c.phases()
	if !ok {
		return
	}
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
