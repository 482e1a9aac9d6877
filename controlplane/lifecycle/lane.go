package lifecycle

import "github.com/warmfleet/warmfleet/schemas"

// LaneBooking books an accepted Run's next attempt on the ephemeral lane:
// a Placement on the lane's pseudo-node, with the offer it is sent to
// recorded before the provider is asked, so an answer that is lost can be
// found again by the attempt id (its launch key).
type LaneBooking struct {
	Placement
	Connection, OfferID string
}

// Apply implements Transition.
func (b LaneBooking) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	b.NodeID = schemas.LaneNodeID(b.Connection)
	r, evs, err := b.Placement.Apply(r)
	if err != nil {
		return r, nil, err
	}
	r.Execution = &schemas.Execution{Connection: b.Connection, OfferID: b.OfferID}
	return r, evs, nil
}

// LaneLaunched records the provider's id for the attempt's execution.
type LaneLaunched struct {
	AttemptID, ExecutionID string
}

// Apply implements Transition.
func (l LaneLaunched) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	if r.AttemptID != l.AttemptID || r.Phase.Terminal() || r.Execution == nil || r.Execution.ExecutionID == l.ExecutionID {
		return r, nil, ErrNoChange
	}
	x := *r.Execution
	x.ExecutionID = l.ExecutionID
	r.Execution = &x
	return r, []schemas.RunEvent{{Type: schemas.EventNote, Phase: r.Phase, NodeID: r.NodeID, Attempt: r.Attempt,
		Message: "execution " + l.ExecutionID + " queued on " + x.OfferID}}, nil
}
