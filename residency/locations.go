package residency

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// ObservedState is a residency's state as published in wf_residency.
type ObservedState = schemas.ResidencyState

// Published states. StateExpired is the tombstone.
const (
	StateAttaching ObservedState = "attaching"
	StateResident  ObservedState = "resident"
	StateReleasing ObservedState = "releasing"
	StateExpired   ObservedState = "expired"
)

// Observation is a residency as published in wf_residency under
// `<tenant>.<session>`: the wire's schemas.ResidencyObservation (a
// conversion either way costs nothing), read here through Key and Holds.
type Observation schemas.ResidencyObservation

// Holds reports whether the residency's workload may be running on its
// host, holding what it was given.
func (o Observation) Holds() bool {
	return o.State == StateAttaching || o.State == StateResident || o.State == StateReleasing
}

// Key is the observation's session.
func (o Observation) Key() Key { return Key{Tenant: o.Tenant, Session: o.Session} }

// Locations is the control plane's residency directory, seen from a host.
// KVLocations implements it over wf_residency.
type Locations interface {
	// PublishResidency writes the observation under its epoch. It refuses
	// with ErrEpochSuperseded an epoch lower than the stored one (or than
	// the session's current lease), with ErrNotLeaseHolder one whose host
	// does not hold the session's lease at exactly its epoch, and with
	// ErrTombstoned a publish at the epoch of an existing tombstone.
	PublishResidency(ctx context.Context, obs Observation) error
	// TombstoneResidency writes the `expired` tombstone at epoch, keeping
	// the epoch high-water mark. It refuses with ErrEpochSuperseded when a
	// later epoch is stored (a stale holder cannot tombstone its successor's
	// route), and with ErrNotLeaseHolder one from a host not holding the
	// lease at exactly epoch. It is idempotent.
	TombstoneResidency(ctx context.Context, key Key, host string, epoch ResidencyEpoch) error
}

// KVLocationsOptions configures KVLocations.
type KVLocationsOptions = StoreOptions

// KVLocations is the control plane's Locations over wf_residency. Every
// write is read → compare epochs → Update(rev) (or Create), retried on a
// revision conflict; nothing is ever deleted. It also reads wf_leases so a
// holder whose lease has already been granted to a successor cannot publish
// in the moment before the successor does.
type KVLocations struct {
	leasedBucket
}

var _ Locations = (*KVLocations)(nil)

// NewKVLocations binds wf_residency and wf_leases.
func NewKVLocations(ctx context.Context, o KVLocationsOptions) (*KVLocations, error) {
	b, err := bindLeased(ctx, o.JS, bus.BucketResidency, o.Clock, o.Logger, "locations")
	if err != nil {
		return nil, err
	}
	return &KVLocations{b}, nil
}

// Get reads a session's observation and its revision.
func (s *KVLocations) Get(ctx context.Context, key Key) (Observation, uint64, error) {
	var o Observation
	rev, err := bus.GetJSON(ctx, s.kv, key.String(), &o)
	return o, rev, err
}

// PublishResidency implements Locations.
func (s *KVLocations) PublishResidency(ctx context.Context, obs Observation) error {
	key := obs.Key()
	if err := key.Validate(); err != nil {
		return err
	}
	if obs.Epoch == 0 || obs.Host == "" {
		return fmt.Errorf("%w: observation needs a host and a non-zero epoch", ErrInvalidRequest)
	}
	if obs.State == StateExpired {
		return fmt.Errorf("%w: publish an expired state with TombstoneResidency", ErrInvalidRequest)
	}
	return s.write(ctx, key, obs.Host, obs.Epoch, func(cur *Observation, exists bool) (Observation, error) {
		if exists && cur.Epoch == obs.Epoch {
			if cur.Host != obs.Host {
				return Observation{}, fmt.Errorf("%w: epoch %d of %s belongs to %s, not %s", ErrEpochSuperseded, obs.Epoch, key, cur.Host, obs.Host)
			}
			if cur.State == StateExpired {
				return Observation{}, fmt.Errorf("%w: %s epoch %d", ErrTombstoned, key, obs.Epoch)
			}
		}
		return obs, nil
	})
}

// TombstoneResidency implements Locations.
func (s *KVLocations) TombstoneResidency(ctx context.Context, key Key, host string, epoch ResidencyEpoch) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if host == "" {
		return fmt.Errorf("%w: a tombstone needs its host", ErrInvalidRequest)
	}
	return s.write(ctx, key, host, epoch, func(cur *Observation, exists bool) (Observation, error) {
		if exists && cur.Epoch == epoch && cur.Host != host {
			// One epoch, one holder: another host may not remove its route.
			return Observation{}, fmt.Errorf("%w: epoch %d of %s belongs to %s, not %s", ErrEpochSuperseded, epoch, key, cur.Host, host)
		}
		if exists && cur.Epoch == epoch && cur.State == StateExpired {
			return Observation{}, bus.ErrNoChange
		}
		t := Observation{Tenant: key.Tenant, Session: key.Session, Host: host, Epoch: epoch, State: StateExpired, ObservedAt: s.clock.Now()}
		if exists && cur.Epoch == epoch {
			t.Generation, t.CompatibilityID, t.Namespace = cur.Generation, cur.CompatibilityID, cur.Namespace
		}
		return t, nil
	})
}

// write runs the fenced read → compare → write loop, for host holding the
// session's lease at epoch (leasedBucket.holds). next sees the stored
// observation (if any) whose epoch is not above epoch.
func (s *KVLocations) write(ctx context.Context, key Key, host string, epoch ResidencyEpoch, next func(cur *Observation, exists bool) (Observation, error)) error {
	k := key.String()
	if err := s.holds(ctx, key, host, epoch); err != nil {
		return err
	}
	for range maxCASAttempts {
		var cur Observation
		rev, err := bus.GetJSON(ctx, s.kv, k, &cur)
		exists := true
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			exists = false
		case err != nil:
			return fmt.Errorf("residency: read residency %s: %w", key, err)
		}
		if exists && cur.Epoch > epoch {
			return fmt.Errorf("%w: %s stored epoch %d > %d", ErrEpochSuperseded, key, cur.Epoch, epoch)
		}
		v, err := next(&cur, exists)
		if errors.Is(err, bus.ErrNoChange) {
			return nil
		}
		if err != nil {
			return err
		}
		if !exists {
			_, err = bus.CreateJSON(ctx, s.kv, k, v)
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
		} else {
			_, err = updateJSON(ctx, s.kv, k, v, rev)
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("residency: write residency %s: %w", key, err)
		}
		return nil
	}
	return fmt.Errorf("residency: write residency %s: gave up after %d conflicts", key, maxCASAttempts)
}
