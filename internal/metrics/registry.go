package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/warmfleet/warmfleet/controlplane"
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
// process and Go collectors, the control plane's counters read from snapshot
// at every scrape, and, when phases is not nil, the Runs by phase.
func NewControlPlaneRegistry(snapshot func() controlplane.Metrics, phases func() (map[schemas.Phase]int, bool)) *prometheus.Registry {
	reg := newProcessRegistry()
	reg.MustRegister(NewControlPlaneCollector(snapshot))
	if phases != nil {
		reg.MustRegister(NewRunPhaseCollector(phases))
	}
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
