package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AgentImages are an agent's image fetch figures; it implements
// agent.ImageMetrics.
type AgentImages struct {
	credential *prometheus.HistogramVec
	fetch      *prometheus.HistogramVec
	fetched    *prometheus.CounterVec
}

// NewAgentImages registers the figures with reg, labelled with node_id.
func NewAgentImages(reg prometheus.Registerer, nodeID string) *AgentImages {
	labels := prometheus.Labels{"node_id": nodeID}
	m := &AgentImages{
		credential: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: "agent", Name: "registry_credential_seconds",
			Help: "Seconds one ask of the control plane for a registry credential took, by whether a credential came.", ConstLabels: labels,
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 30}}, []string{"outcome"}),
		fetch: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: "agent", Name: "image_fetch_seconds",
			Help: "Seconds making an absent image ready took (fetch or import, and unpack), by source.", ConstLabels: labels,
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}}, []string{"source"}),
		fetched: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "agent", Name: "image_fetched_bytes_total",
			Help: "Bytes of image content brought onto this machine, by source.", ConstLabels: labels}, []string{"source"}),
	}
	reg.MustRegister(m.credential, m.fetch, m.fetched)
	return m
}

// CredentialAsked records one ask.
func (m *AgentImages) CredentialAsked(d time.Duration, answered bool) {
	outcome := "answered"
	if !answered {
		outcome = "failed"
	}
	m.credential.WithLabelValues(outcome).Observe(d.Seconds())
}

// ImageFetched records one fetch.
func (m *AgentImages) ImageFetched(source string, bytes int64, d time.Duration) {
	m.fetch.WithLabelValues(source).Observe(d.Seconds())
	m.fetched.WithLabelValues(source).Add(float64(bytes))
}
