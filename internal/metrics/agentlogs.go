package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AgentLogs are an agent's output-shipping figures; it implements
// agent.LogMetrics.
type AgentLogs struct {
	shipped *prometheus.CounterVec
	dropped prometheus.Counter
	lag     prometheus.Histogram
	behind  prometheus.Gauge
}

// NewAgentLogs registers the figures with reg, labelled with node_id.
func NewAgentLogs(reg prometheus.Registerer, nodeID string) *AgentLogs {
	labels := prometheus.Labels{"node_id": nodeID}
	m := &AgentLogs{
		shipped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "agent", Name: "log_shipped_bytes_total",
			Help: "Bytes of Run output stored in WF_LOGS, by stream.", ConstLabels: labels}, []string{"stream"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "agent", Name: "log_dropped_bytes_total",
			Help: "Bytes of Run output dropped at the node for exceeding the per-Run log rate limit.", ConstLabels: labels}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: "agent", Name: "log_ship_lag_seconds",
			Help: "Seconds from the node receiving a chunk's first byte to JetStream storing the chunk.", ConstLabels: labels,
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}),
		behind: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: "agent", Name: "log_behind_bytes",
			Help: "Bytes of Run output written on this node and not yet stored in WF_LOGS.", ConstLabels: labels}),
	}
	reg.MustRegister(m.shipped, m.dropped, m.lag, m.behind)
	return m
}

// Shipped counts a stored chunk.
func (m *AgentLogs) Shipped(stream string, bytes, dropped int64, lag time.Duration) {
	m.shipped.WithLabelValues(stream).Add(float64(bytes))
	if dropped > 0 {
		m.dropped.Add(float64(dropped))
	}
	m.lag.Observe(lag.Seconds())
}

// Behind sets the backlog.
func (m *AgentLogs) Behind(bytes int64) { m.behind.Set(float64(bytes)) }
