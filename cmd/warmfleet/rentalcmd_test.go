package main

import (
	"bytes"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestConnectionRows: the connections table marks a failed connection as
// skipped with its error, and an ephemeral executor's as the lane's.
func TestConnectionRows(t *testing.T) {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	connectionRows(tw, []schemas.ConnectionStatus{
		{ID: "sf", Type: "shadeform", State: schemas.ConnectionOK, Live: 2, MaxRentals: 4, VerifiedAt: time.Unix(0, 0)},
		{ID: "rp", Type: "runpod", State: schemas.ConnectionFailed, Error: "401 unauthorized"},
		{ID: "pool", Type: "runpod-serverless", State: schemas.ConnectionOK, Live: 1, Lane: true},
	})
	_ = tw.Flush()
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := [][]string{
		{"CONNECTION", "TYPE", "STATE", "LIVE", "MAX", "VERIFIED", "ERROR"},
		{"sf", "shadeform", "ok", "2", "4", "1970-01-01T00:00:00Z", "-"},
		{"rp", "runpod", "failed", "(skipped)", "0", "-", "-", "401", "unauthorized"},
		{"pool", "runpod-serverless", "(lane)", "ok", "1", "-", "-", "-"},
	}
	if len(lines) != len(want) {
		t.Fatalf("table:\n%s", b.String())
	}
	for i, l := range lines {
		if got := strings.Fields(l); strings.Join(got, " ") != strings.Join(want[i], " ") {
			t.Errorf("row %d: %q, want %q", i, got, want[i])
		}
	}
}
