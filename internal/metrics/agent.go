package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmfleet/warmfleet/schemas"
)

// AgentCollector exposes an agent's session, read from its Enrollment at
// every scrape.
type AgentCollector struct {
	enrollment                                     func() schemas.Enrollment
	enrolled, fencingToken, generation, sessionExp *prometheus.Desc
}

// NewAgentCollector labels every metric with node_id and reads enrollment
// (normally agent.Agent.Enrollment) at every scrape.
func NewAgentCollector(nodeID string, enrollment func() schemas.Enrollment) *AgentCollector {
	labels := prometheus.Labels{"node_id": nodeID}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "agent", name), help, nil, labels)
	}
	return &AgentCollector{
		enrollment:   enrollment,
		enrolled:     d("enrolled", "1 while the agent holds a session from the control plane, 0 before it enrolls."),
		fencingToken: d("fencing_token", "Fencing token of the agent's session (0 before it enrolls); every enrollment raises it."),
		generation:   d("generation", "Rental lifecycle generation the agent enrolled under (0 before it enrolls)."),
		sessionExp:   d("session_expiry_timestamp_seconds", "When the agent's session expires unless renewed, as a Unix time (absent before it enrolls)."),
	}
}

// Describe implements prometheus.Collector.
func (c *AgentCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.enrolled
	ch <- c.fencingToken
	ch <- c.generation
	ch <- c.sessionExp
}

// Collect implements prometheus.Collector.
func (c *AgentCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.enrollment()
	enrolled := 0.0
	if Enrolled(e) {
		enrolled = 1
	}
	ch <- prometheus.MustNewConstMetric(c.enrolled, prometheus.GaugeValue, enrolled)
	ch <- prometheus.MustNewConstMetric(c.fencingToken, prometheus.GaugeValue, float64(e.FencingToken))
	ch <- prometheus.MustNewConstMetric(c.generation, prometheus.GaugeValue, float64(e.Generation))
	if !e.SessionExpires.IsZero() {
		ch <- prometheus.MustNewConstMetric(c.sessionExp, prometheus.GaugeValue, float64(e.SessionExpires.UnixNano())/1e9)
	}
}

// Enrolled reports whether e is a session the control plane granted (the
// zero Enrollment means the agent has not enrolled yet). It is the agent's
// readiness.
func Enrolled(e schemas.Enrollment) bool { return e.FencingToken != 0 }
