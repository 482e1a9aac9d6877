package controlplane

import (
	"testing"
	"time"
)

// TestRetentionDefaults: an unset retention is seven days with events kept
// twice as long; a negative retention, or events kept no longer than the
// Runs, is refused.
func TestRetentionDefaults(t *testing.T) {
	var c Config
	if err := c.checkRetention(); err != nil || c.RunRetention != DefaultRunRetention || c.Topology.EventsMaxAge != 2*DefaultRunRetention {
		t.Fatalf("defaults: retention %s, events %s, %v", c.RunRetention, c.Topology.EventsMaxAge, err)
	}
	c = Config{RunRetention: -time.Hour}
	if err := c.checkRetention(); err == nil {
		t.Error("a negative retention was accepted")
	}
	c = Config{RunRetention: time.Hour}
	c.Topology.EventsMaxAge = time.Hour
	if err := c.checkRetention(); err == nil {
		t.Error("events kept no longer than the Runs were accepted")
	}
}
