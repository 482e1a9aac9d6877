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
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			key := f.GetName()
			for _, l := range mt.GetLabel() {
				if l.GetName() != "node_id" {
					key += "/" + l.GetValue()
				} else if l.GetValue() != "gpu-7" {
					t.Errorf("%s labelled node %q", f.GetName(), l.GetValue())
				}
			}
			switch {
			case mt.GetHistogram() != nil:
				got[key+" count"] = float64(mt.GetHistogram().GetSampleCount())
				got[key+" sum"] = mt.GetHistogram().GetSampleSum()
			case mt.GetCounter() != nil:
				got[key] = mt.GetCounter().GetValue()
			}
		}
	}
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
