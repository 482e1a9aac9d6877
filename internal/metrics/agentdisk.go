package metrics

import "github.com/prometheus/client_golang/prometheus"

// AgentDisk counts an agent's disk evictions; it implements
// agent.DiskMetrics.
type AgentDisk struct {
	evictions *prometheus.CounterVec
	freed     *prometheus.CounterVec
}

// NewAgentDisk registers the counters with reg, labelled with node_id.
func NewAgentDisk(reg prometheus.Registerer, nodeID string) *AgentDisk {
	labels := prometheus.Labels{"node_id": nodeID}
	m := &AgentDisk{
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "agent", Name: "disk_evictions_total",
			Help: "Images and caches the agent removed from its disk (collection past the high watermark, or a prune), by kind.", ConstLabels: labels}, []string{"kind"}),
		freed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "agent", Name: "disk_evicted_bytes_total",
			Help: "Bytes those removals freed, by kind.", ConstLabels: labels}, []string{"kind"}),
	}
	reg.MustRegister(m.evictions, m.freed)
	return m
}

// Evicted counts one removal.
func (m *AgentDisk) Evicted(kind string, bytes int64) {
	m.evictions.WithLabelValues(kind).Inc()
	m.freed.WithLabelValues(kind).Add(float64(bytes))
}
