package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// gathered reads reg into name/label values → value, a histogram as its
// "count" and "sum"; every metric must be labelled with node.
func gathered(t *testing.T, reg *prometheus.Registry, node string) map[string]float64 {
	t.Helper()
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
				} else if l.GetValue() != node {
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
	return got
}
