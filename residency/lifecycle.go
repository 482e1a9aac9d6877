package residency

import "fmt"

// Phase is where one residency is in its lifecycle on this host.
type Phase string

// Phases. Released, Lost and Failed are terminal: a later residency of the
// same session is a new one, with a new generation.
const (
	PhaseAttaching Phase = "attaching"
	PhaseResident  Phase = "resident"
	PhaseReleasing Phase = "releasing"
	PhaseReleased  Phase = "released"
	PhaseLost      Phase = "lost"
	PhaseFailed    Phase = "failed"
)

// Event moves a residency from one phase to another.
type Event string

// Lifecycle events.
const (
	// EventAttached: every attach step succeeded.
	EventAttached Event = "attached"
	// EventAttachFailed: an attach step failed; its compensations ran.
	EventAttachFailed Event = "attach_failed"
	// EventBeginRelease: a warm release, a drain or an explicit release
	// started.
	EventBeginRelease Event = "begin_release"
	// EventAbortRelease: the runtime refused to release (or a step before
	// it failed); back to resident under the same generation.
	EventAbortRelease Event = "abort_release"
	// EventReleased: the release tombstoned the route and dropped the lease.
	EventReleased Event = "released"
	// EventLost: the grant was lost (renewal failure, expiry, a later
	// epoch observed); the heartbeat surrenders.
	EventLost Event = "lost"
)

// transitions is the residency lifecycle, the only place it is written.
//
//	attaching ─attached─► resident ─begin_release─► releasing ─released─► released
//	    │                    ▲  │                      │  │
//	    └attach_failed─►failed  └──────abort_release───┘  └lost─► lost ◄─lost─ resident
var transitions = map[Phase]map[Event]Phase{
	PhaseAttaching: {
		EventAttached:     PhaseResident,
		EventAttachFailed: PhaseFailed,
	},
	PhaseResident: {
		EventBeginRelease: PhaseReleasing,
		EventLost:         PhaseLost,
	},
	PhaseReleasing: {
		EventAbortRelease: PhaseResident,
		EventReleased:     PhaseReleased,
		EventLost:         PhaseLost,
	},
	PhaseReleased: {},
	PhaseLost:     {},
	PhaseFailed:   {},
}

// Next is the phase e leads to from p, or ErrIllegalTransition.
func (p Phase) Next(e Event) (Phase, error) {
	if n, ok := transitions[p][e]; ok {
		return n, nil
	}
	return p, fmt.Errorf("%w: %s in phase %s", ErrIllegalTransition, e, p)
}

// Terminal reports whether no event leaves p.
func (p Phase) Terminal() bool { return len(transitions[p]) == 0 }

// Observed is the state a phase publishes in wf_residency.
func (p Phase) Observed() ObservedState {
	switch p {
	case PhaseAttaching:
		return StateAttaching
	case PhaseResident:
		return StateResident
	case PhaseReleasing:
		return StateReleasing
	default:
		return StateExpired
	}
}
