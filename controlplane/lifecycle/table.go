package lifecycle

import (
	"errors"
	"fmt"

	"github.com/warmfleet/warmfleet/schemas"
)

// Table is the Run lifecycle: from → the phases it may move to. Forward
// skips are legal because a node's reports can arrive late or be lost (a
// "running" report implies preparing and launching happened); backward moves
// never are, so a stale or reordered report changes nothing. A move back to
// accepted ends a booked attempt that is placed again: a retry its retry
// policy allows (without one, after the loss of its node), or a requeue
// after it was preempted.
var table = map[schemas.Phase][]schemas.Phase{
	schemas.PhaseAccepted:  {schemas.PhasePlaced, schemas.PhaseCancelled, schemas.PhaseFailed},
	schemas.PhasePlaced:    {schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning, schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost, schemas.PhaseAccepted},
	schemas.PhasePreparing: {schemas.PhaseLaunching, schemas.PhaseRunning, schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost, schemas.PhaseAccepted},
	schemas.PhaseLaunching: {schemas.PhaseRunning, schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost, schemas.PhaseAccepted},
	schemas.PhaseRunning:   {schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost, schemas.PhaseAccepted},
	// Terminal phases have no way out.
}

// Phases lists every phase in lifecycle order, terminal ones last.
var Phases = []schemas.Phase{schemas.PhaseAccepted, schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching,
	schemas.PhaseRunning, schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost}

// Errors a transition returns, matched with errors.Is.
var (
	// ErrIllegalTransition: the table does not allow the move.
	ErrIllegalTransition = errors.New("illegal run transition")
	// ErrNoChange: the Run already reflects the input, or the input no
	// longer applies to it (another attempt, a terminal Run). Nothing is
	// written.
	ErrNoChange = errors.New("run: no change")
	// ErrStaleReport: a node report names a phase the Run has passed. It
	// matches ErrNoChange.
	ErrStaleReport = fmt.Errorf("%w: report is older than the run", ErrNoChange)
	// ErrSuperseded: a node report is about an attempt the Run has moved on
	// from while that attempt still runs there; the node should stop it. It
	// matches ErrNoChange.
	ErrSuperseded = fmt.Errorf("%w: report is about a superseded attempt", ErrNoChange)
	// ErrNotBookedHere: a receipt or report names the Run's current
	// attempt but comes from another node than the one it is booked on
	// (attempt ids are derivable, so the id alone proves nothing).
	ErrNotBookedHere = fmt.Errorf("%w: attempt is booked on another node", ErrNoChange)
)

// Legal reports whether the table allows from → to.
func Legal(from, to schemas.Phase) bool {
	for _, p := range table[from] {
		if p == to {
			return true
		}
	}
	return false
}

// Check returns ErrIllegalTransition, naming both phases, unless from → to
// is legal.
func Check(from, to schemas.Phase) error {
	if Legal(from, to) {
		return nil
	}
	return fmt.Errorf("%w: %s → %s", ErrIllegalTransition, from, to)
}

// Rank orders the non-terminal phases so a report can be recognised as old
// news (it names a phase the Run has already passed); terminal phases rank
// last.
func Rank(p schemas.Phase) int {
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

// move changes r's phase by the table. Transfer progress belongs to the
// preparing phase alone, so any other phase clears it; why a Run waits
// belongs to accepted.
func move(r *schemas.Run, to schemas.Phase) error {
	if err := Check(r.Phase, to); err != nil {
		return err
	}
	r.Phase = to
	if to != schemas.PhasePreparing {
		r.Progress = nil
	}
	if to != schemas.PhaseAccepted {
		r.WaitCode = "" // a Run waits in accepted alone
	}
	if to == schemas.PhaseAccepted || to.Terminal() {
		r.Stopping = "" // a stop belongs to the attempt that ended
	}
	return nil
}
