package controlplane

import (
	"errors"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestRunTransitions(t *testing.T) {
	all := []schemas.Phase{schemas.PhaseAccepted, schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching,
		schemas.PhaseRunning, schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost}
	for _, from := range all {
		for _, to := range all {
			err := checkTransition(from, to)
			switch {
			case from.Terminal():
				if err == nil {
					t.Errorf("%s → %s allowed out of a terminal phase", from, to)
				}
			case to == schemas.PhaseAccepted:
				// Only a lost attempt goes back, and only once booked.
				if (err == nil) != (from != schemas.PhaseAccepted) {
					t.Errorf("%s → accepted: %v", from, err)
				}
			case !to.Terminal() && phaseRank(to) <= phaseRank(from):
				if err == nil {
					t.Errorf("%s → %s is backwards but allowed", from, to)
				}
			}
			if err != nil && !errors.Is(err, ErrIllegalTransition) {
				t.Errorf("%s → %s: error %v is not ErrIllegalTransition", from, to, err)
			}
		}
	}
	// Forward skips are legal: a late report implies the phases before it.
	for _, ok := range [][2]schemas.Phase{{schemas.PhasePlaced, schemas.PhaseRunning}, {schemas.PhasePlaced, schemas.PhaseSucceeded}, {schemas.PhaseAccepted, schemas.PhaseCancelled}} {
		if err := checkTransition(ok[0], ok[1]); err != nil {
			t.Errorf("%s → %s refused: %v", ok[0], ok[1], err)
		}
	}
	// An accepted Run cannot jump to running without a booking.
	if checkTransition(schemas.PhaseAccepted, schemas.PhaseRunning) == nil {
		t.Error("accepted → running allowed without placement")
	}
}
