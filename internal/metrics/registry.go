package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/warmfleet/warmfleet/schemas"
)

// newProcessRegistry returns a fresh registry holding the process and Go
// runtime collectors every warmfleet process exposes.
func newProcessRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector(),
	)
	return reg
}

// NewControlPlaneRegistry returns a registry for a control-plane process: the
// process and Go collectors, and the control plane's counters and Runs by
// phase, read from snapshot (normally the control plane's Metrics method)
// at every scrape.
func NewControlPlaneRegistry(snapshot func() ControlPlane) *prometheus.Registry {
	reg := newProcessRegistry()
	reg.MustRegister(NewControlPlaneCollector(snapshot))
	return reg
}

// NewAgentRegistry returns a registry for an agent process: the process and
// Go collectors and the agent's session, read from enrollment at every
// scrape.
func NewAgentRegistry(nodeID string, enrollment func() schemas.Enrollment) *prometheus.Registry {
	reg := newProcessRegistry()
	reg.MustRegister(NewAgentCollector(nodeID, enrollment))
	return reg
}
