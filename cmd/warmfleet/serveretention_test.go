package main

import (
	"strings"
	"testing"
	"time"
)

// A retention that keeps nothing, and events kept no longer than the Runs
// they describe, are refused naming the flag; leaving --events-max-age out
// is accepted.
func TestRetentionFlags(t *testing.T) {
	week := 168 * time.Hour
	for _, tc := range []struct {
		retention, events time.Duration
		refused           string
	}{
		{week, 0, ""},
		{week, 2 * week, ""},
		{0, 0, "--run-retention"},
		{-time.Hour, 0, "--run-retention"},
		{week, week, "--events-max-age"},
		{week, time.Hour, "--events-max-age"},
		{week, -time.Hour, "--events-max-age"},
	} {
		err := checkRetentionFlags(tc.retention, tc.events)
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("retention %s, events %s refused: %v", tc.retention, tc.events, err)
		case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("retention %s, events %s: %v, want a refusal naming %s", tc.retention, tc.events, err, tc.refused)
		}
	}
}
