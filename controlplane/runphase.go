package controlplane

import (
	"fmt"

	"github.com/warmfleet/warmfleet/schemas"
)

// runTransitions is the Run lifecycle: from → the phases it may move to.
// Forward skips are legal because a node's reports can arrive late or be
// lost (a "running" report implies preparing and launching happened);
// backward moves never are, so a stale or reordered report changes nothing.
// A move back to accepted is a retry after the attempt's node was lost.
var runTransitions = map[schemas.Phase][]schemas.Phase{
	schemas.PhaseAccepted:  {schemas.PhasePlaced, schemas.PhaseCancelled, schemas.PhaseFailed},
	schemas.PhasePlaced:    {schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning, schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost, schemas.PhaseAccepted},
	schemas.PhasePreparing: {schemas.PhaseLaunching, schemas.PhaseRunning, schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost, schemas.PhaseAccepted},
	schemas.PhaseLaunching: {schemas.PhaseRunning, schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost, schemas.PhaseAccepted},
	schemas.PhaseRunning:   {schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost, schemas.PhaseAccepted},
	// Terminal phases have no way out.
}

// ErrIllegalTransition is returned for a move the table does not allow.
var ErrIllegalTransition = fmt.Errorf("illegal run transition")

// checkTransition reports whether from → to is legal.
func checkTransition(from, to schemas.Phase) error {
	for _, p := range runTransitions[from] {
		if p == to {
			return nil
		}
	}
	return fmt.Errorf("%w: %s → %s", ErrIllegalTransition, from, to)
}

// phaseRank orders the non-terminal phases so a report can be recognised as
// old news (it names a phase the Run has already passed).
func phaseRank(p schemas.Phase) int {
	switch p {
	case schemas.PhaseAccepted:
		return 0
	case schemas.PhasePlaced:
		return 1
	case schemas.PhasePreparing:
		return 2
	case schemas.PhaseLaunching:
		return 3
	case schemas.PhaseRunning:
		return 4
	}
	return 5
}
