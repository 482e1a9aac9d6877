package controlplane

import (
	"testing"

	"github.com/warmfleet/warmfleet/controlplane/placement"
)

// TestPlacementWholeNodeDefault: an unset whole-node price takes
// placement's default, and a negative one (off) is kept.
func TestPlacementWholeNodeDefault(t *testing.T) {
	var c Config
	c.defaults()
	if got, want := c.Placement.WholeNodeSeconds, placement.DefaultConfig().WholeNodeSeconds; got != want || want <= 0 {
		t.Errorf("unset: %v, want the default %v (> 0)", got, want)
	}
	off := Config{Placement: placement.Config{WholeNodeSeconds: -1}}
	off.defaults()
	if off.Placement.WholeNodeSeconds != -1 {
		t.Errorf("off: %v, want -1 kept", off.Placement.WholeNodeSeconds)
	}
}

// TestPlacementFailedNodePenaltyDefault: an unset failed-node penalty
// takes placement's default, and a negative one (off) is kept.
func TestPlacementFailedNodePenaltyDefault(t *testing.T) {
	var c Config
	c.defaults()
	if got, want := c.Placement.FailedNodePenaltySeconds, placement.DefaultConfig().FailedNodePenaltySeconds; got != want || want <= 0 {
		t.Errorf("unset: %v, want the default %v (> 0)", got, want)
	}
	off := Config{Placement: placement.Config{FailedNodePenaltySeconds: -1}}
	off.defaults()
	if off.Placement.FailedNodePenaltySeconds != -1 {
		t.Errorf("off: %v, want -1 kept", off.Placement.FailedNodePenaltySeconds)
	}
}
