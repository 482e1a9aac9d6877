package fake

import (
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// machine is one simulated machine. Its state is a timeline evaluated
// lazily against the clock, so the world needs no goroutines and the same
// calls at the same virtual times always give the same answers.
type machine struct {
	ref, rental, owner, opKey string
	reqHash                   string
	generation                uint64
	offer                     capacity.Offer
	interruptible             bool
	userData                  []byte
	createdAt                 time.Time
	endpoint                  string

	state capacity.State
	since time.Time
	// next holds scheduled transitions, ascending by time.
	next []transition
	// endAt is when the provider reclaims the machine on its own (spot
	// interruption or max lifetime); zero when it never will.
	endAt          time.Time
	endInterrupted bool
	interrupted    bool
}

type transition struct {
	at    time.Time
	state capacity.State
}

// advance applies every transition due by now, and the provider's own
// reclamation if it falls before them.
func (m *machine) advance(now time.Time) {
	for len(m.next) > 0 && !m.next[0].at.After(now) {
		t := m.next[0]
		if !m.endAt.IsZero() && !m.endAt.After(t.at) {
			break
		}
		m.state, m.since = t.state, t.at
		m.next = m.next[1:]
	}
	if !m.endAt.IsZero() && !m.endAt.After(now) && m.state != capacity.StateTerminated {
		m.state, m.since = capacity.StateTerminated, m.endAt
		m.interrupted = m.endInterrupted
		m.next = nil
		m.endAt = time.Time{}
	}
}

// plan puts the machine in state now and schedules the rest, replacing
// whatever was scheduled.
func (m *machine) plan(now time.Time, state capacity.State, then ...transition) {
	m.state, m.since = state, now
	m.next = then
}

// runningAt is when the machine is scheduled to reach running, or zero.
func (m *machine) runningAt() time.Time {
	for _, t := range m.next {
		if t.state == capacity.StateRunning {
			return t.at
		}
	}
	if m.state == capacity.StateRunning {
		return m.since
	}
	return time.Time{}
}

// reclaimAt sets a provider-side reclamation if it is earlier than the one
// already set.
func (m *machine) reclaimAt(at time.Time, interrupted bool) {
	if at.IsZero() {
		return
	}
	if m.endAt.IsZero() || at.Before(m.endAt) {
		m.endAt, m.endInterrupted = at, interrupted
	}
}

func (m *machine) owned(connectionID string) capacity.OwnedCapacity {
	return capacity.OwnedCapacity{
		NativeRef: m.ref, ConnectionID: connectionID, RentalID: m.rental, Generation: m.generation,
		OwnershipToken: m.owner, OperationKey: m.opKey, State: m.state, CreatedAt: m.createdAt,
	}
}
