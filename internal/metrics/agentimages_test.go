package metrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmfleet/warmfleet/internal/metrics"
)

// TestAgentImages: credential asks and fetches land in their histograms,
// by outcome and source, and fetched bytes are summed by source.
func TestAgentImages(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewAgentImages(reg, "gpu-7")
	m.CredentialAsked(3*time.Millisecond, true)
	m.CredentialAsked(20*time.Second, false)
	m.ImageFetched("registry", 1<<20, 2*time.Second)
	m.ImageFetched("registry", 1<<20, 4*time.Second)
	m.ImageFetched("archive", 10, time.Second)
	got := gathered(t, reg, "gpu-7")
	for k, want := range map[string]float64{
		"warmfleet_agent_registry_credential_seconds/answered count": 1,
		"warmfleet_agent_registry_credential_seconds/answered sum":   0.003,
		"warmfleet_agent_registry_credential_seconds/failed count":   1,
		"warmfleet_agent_image_fetch_seconds/registry count":         2,
		"warmfleet_agent_image_fetch_seconds/registry sum":           6,
		"warmfleet_agent_image_fetch_seconds/archive count":          1,
		"warmfleet_agent_image_fetched_bytes_total/registry":         2 << 20,
		"warmfleet_agent_image_fetched_bytes_total/archive":          10,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
}
