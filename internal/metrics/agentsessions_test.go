package metrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmfleet/warmfleet/internal/metrics"
)

// TestAgentSessions: checkpoints taken and restored land in their
// histogram and byte counter by kind; a failed one only counts as failed.
func TestAgentSessions(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewAgentSessions(reg, "gpu-7")
	m.Checkpointed("release", 3<<20, 2*time.Second, false)
	m.Checkpointed("periodic", 1<<20, time.Second, false)
	m.Checkpointed("periodic", 1<<20, 3*time.Second, false)
	m.Checkpointed("restore", 5<<20, 4*time.Second, false)
	m.Checkpointed("restore", 9<<20, time.Minute, true)
	got := gathered(t, reg, "gpu-7")
	for k, want := range map[string]float64{
		"warmfleet_agent_session_checkpoint_seconds/release count":  1,
		"warmfleet_agent_session_checkpoint_seconds/periodic count": 2,
		"warmfleet_agent_session_checkpoint_seconds/periodic sum":   4,
		"warmfleet_agent_session_checkpoint_seconds/restore count":  1,
		"warmfleet_agent_session_checkpoint_bytes_total/release":    3 << 20,
		"warmfleet_agent_session_checkpoint_bytes_total/periodic":   2 << 20,
		"warmfleet_agent_session_checkpoint_bytes_total/restore":    5 << 20,
		"warmfleet_agent_session_checkpoint_failures_total/restore": 1,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
}
