package rentals

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// store is this replica's copy of wf_rentals, kept by a KV watch, so the
// scheduler's questions (asked for each waiting Run on every pass) read no
// KV. Writes are CAS updates whose result is noted at once, ahead of the
// watch; the janitor, which terminates machines, reads KV itself.
type store struct {
	kv  jetstream.KeyValue
	now func() time.Time

	mu   sync.RWMutex
	byID map[string]storedRental
}

type storedRental struct {
	rt  schemas.Rental
	rev uint64
}

func newStore(kv jetstream.KeyValue, now func() time.Time) *store {
	return &store{kv: kv, now: now, byID: map[string]storedRental{}}
}

// start opens the watch and returns once its initial values are in; the
// watch goroutine, which wg owns, runs until ctx ends.
func (s *store) start(ctx context.Context, wg *sync.WaitGroup) error {
	return bus.Mirror(ctx, wg, s.kv, s.apply)
}

func (s *store) apply(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		s.mu.Lock()
		delete(s.byID, e.Key())
		s.mu.Unlock()
		return
	}
	var rt schemas.Rental
	if json.Unmarshal(e.Value(), &rt) != nil {
		return
	}
	s.note(rt, e.Revision())
}

// note records rt at rev unless a later revision is held.
func (s *store) note(rt schemas.Rental, rev uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.byID[rt.RentalID]; ok && old.rev >= rev {
		return
	}
	s.byID[rt.RentalID] = storedRental{rt, rev}
}

// list returns every rental, by id.
func (s *store) list() []schemas.Rental {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]schemas.Rental, 0, len(s.byID))
	for _, e := range s.byID {
		out = append(out, e.rt)
	}
	slices.SortFunc(out, func(a, b schemas.Rental) int { return cmp.Compare(a.RentalID, b.RentalID) })
	return out
}

// get returns one rental as held.
func (s *store) get(id string) (schemas.Rental, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.byID[id]
	return e.rt, ok
}

// create stores a new rental.
func (s *store) create(ctx context.Context, rt schemas.Rental) error {
	rev, err := bus.CreateJSON(ctx, s.kv, rt.RentalID, &rt)
	if err != nil {
		return err
	}
	s.note(rt, rev)
	return nil
}

// update is a CAS update of one rental; mutate may return bus.ErrNoChange.
func (s *store) update(ctx context.Context, id string, mutate func(*schemas.Rental, time.Time) error) error {
	now := s.now()
	rt, rev, err := bus.UpdateJSON(ctx, s.kv, id, func(r *schemas.Rental) error {
		if err := mutate(r, now); err != nil {
			return err
		}
		r.UpdatedAt = now
		return nil
	})
	if errors.Is(err, bus.ErrNoChange) {
		return nil
	}
	if err == nil {
		s.note(rt, rev)
	}
	return err
}

// setRentalState moves a rental by the table and records the stage: at the
// provider's own time when it gave one (its StateSince, or the AcceptedAt of
// the receipt that moved it), else as a bound at now — the stage was entered
// at or before now, and the interval since the last look is the caller's
// cadence, not a property of the machine.
func setRentalState(s *schemas.Rental, to schemas.RentalState, providerSince, now time.Time) error {
	return setRentalStateBy(s, to, providerSince, schemas.StageFromProvider, now)
}

// setRentalStateBy records the stage at a known moment from source when
// there is one, else as a bound at now. A moment after now (a provider
// clock ahead of ours) is not believed: it is recorded as a bound too.
func setRentalStateBy(s *schemas.Rental, to schemas.RentalState, at time.Time, source schemas.StageSource, now time.Time) error {
	if err := checkRentalTransition(s.State, to); err != nil {
		return err
	}
	stage := schemas.RentalStage{State: to, At: at, Source: source}
	if at.IsZero() || at.After(now) {
		stage.At, stage.Bound, stage.Source = now, true, schemas.StageObserved
	}
	s.State = to
	s.Stages = append(s.Stages, stage)
	return nil
}
