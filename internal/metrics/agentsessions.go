package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AgentSessions are a session host's checkpoint figures, fed from its
// residency.Hooks.OnCheckpoint.
type AgentSessions struct {
	seconds *prometheus.HistogramVec
	bytes   *prometheus.CounterVec
	failed  *prometheus.CounterVec
}

// NewAgentSessions registers the figures with reg, labelled with node_id.
func NewAgentSessions(reg prometheus.Registerer, nodeID string) *AgentSessions {
	labels := prometheus.Labels{"node_id": nodeID}
	m := &AgentSessions{
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: "agent", Name: "session_checkpoint_seconds",
			Help: "Seconds a session workspace checkpoint took to take or restore, by kind (release, periodic, asked, restore).", ConstLabels: labels,
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}}, []string{"kind"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "agent", Name: "session_checkpoint_bytes_total",
			Help: "Bytes of session workspace checkpoints sent to the control plane or fetched from it, by kind.", ConstLabels: labels}, []string{"kind"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "agent", Name: "session_checkpoint_failures_total",
			Help: "Session workspace checkpoints that failed to be taken or restored, by kind.", ConstLabels: labels}, []string{"kind"}),
	}
	reg.MustRegister(m.seconds, m.bytes, m.failed)
	return m
}

// Checkpointed records one checkpoint of kind taken or restored: the
// bytes that crossed and how long it took, or that it failed.
func (m *AgentSessions) Checkpointed(kind string, moved int64, took time.Duration, failed bool) {
	if failed {
		m.failed.WithLabelValues(kind).Inc()
		return
	}
	m.seconds.WithLabelValues(kind).Observe(took.Seconds())
	m.bytes.WithLabelValues(kind).Add(float64(moved))
}
