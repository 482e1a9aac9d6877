package rentals

import (
	"fmt"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/schemas"
)

// rentalTransitions is the rental lifecycle: from → the states it may move
// to. A provider's report may skip states (a machine seen running was
// booting), never move back, except a stopped machine resuming.
var rentalTransitions = map[schemas.RentalState][]schemas.RentalState{
	schemas.RentalRequested:    {schemas.RentalProvisioning, schemas.RentalBooting, schemas.RentalEnrolling, schemas.RentalFailed},
	schemas.RentalProvisioning: {schemas.RentalBooting, schemas.RentalEnrolling, schemas.RentalFailed, schemas.RentalTerminating, schemas.RentalTerminated, schemas.RentalInterrupted},
	schemas.RentalBooting:      {schemas.RentalEnrolling, schemas.RentalFailed, schemas.RentalTerminating, schemas.RentalTerminated, schemas.RentalInterrupted},
	schemas.RentalEnrolling:    {schemas.RentalReady, schemas.RentalFailed, schemas.RentalTerminating, schemas.RentalTerminated, schemas.RentalInterrupted},
	schemas.RentalReady:        {schemas.RentalDraining, schemas.RentalStopping, schemas.RentalTerminating, schemas.RentalTerminated, schemas.RentalInterrupted, schemas.RentalFailed},
	schemas.RentalDraining:     {schemas.RentalStopping, schemas.RentalTerminating, schemas.RentalTerminated, schemas.RentalInterrupted},
	schemas.RentalStopping:     {schemas.RentalStopped, schemas.RentalTerminating, schemas.RentalTerminated, schemas.RentalFailed},
	schemas.RentalStopped:      {schemas.RentalBooting, schemas.RentalTerminating, schemas.RentalTerminated},
	schemas.RentalTerminating:  {schemas.RentalTerminated, schemas.RentalFailed},
	schemas.RentalInterrupted:  {schemas.RentalTerminating, schemas.RentalTerminated},
}

func checkRentalTransition(from, to schemas.RentalState) error {
	for _, s := range rentalTransitions[from] {
		if s == to {
			return nil
		}
	}
	return fmt.Errorf("%w: rental %s → %s", lifecycle.ErrIllegalTransition, from, to)
}

// rentalStateOf maps what a provider reports onto the rental lifecycle, from
// where the rental is now. It returns "" when the report moves nothing. An
// interruption moves a rental once; after it only the machine's end
// (terminating, terminated) moves it on, since the rental loop terminates
// whatever the provider left of it.
func rentalStateOf(cur schemas.RentalState, obs capacity.Observation) schemas.RentalState {
	if obs.Interrupted && checkRentalTransition(cur, schemas.RentalInterrupted) == nil {
		return schemas.RentalInterrupted
	}
	if cur == schemas.RentalInterrupted && obs.State != capacity.StateTerminating && obs.State != capacity.StateTerminated {
		return ""
	}
	switch obs.State {
	case capacity.StatePending, capacity.StateProvisioning:
		return schemas.RentalProvisioning
	case capacity.StateBooting:
		return schemas.RentalBooting
	case capacity.StateRunning:
		if cur == schemas.RentalReady || cur == schemas.RentalDraining {
			return ""
		}
		return schemas.RentalEnrolling
	case capacity.StateStopping:
		return schemas.RentalStopping
	case capacity.StateStopped:
		return schemas.RentalStopped
	case capacity.StateTerminating:
		return schemas.RentalTerminating
	case capacity.StateTerminated:
		return schemas.RentalTerminated
	case capacity.StateFailed:
		return schemas.RentalFailed
	}
	return ""
}
