package residency

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// Guard is what work checks before it acts: the fence of the grant the work
// was delivered under.
type Guard interface {
	// Check is nil while the grant is held; otherwise it wraps
	// ErrStaleEpoch and the reason (ErrLeaseLost or ErrEpochSuperseded).
	Check() error
	// Epoch is the grant's epoch, the token to stamp on any effect.
	Epoch() ResidencyEpoch
}

// fence is the one object per grant through which a residency writes its
// observation and by which every party (Manager, heartbeat, inbox consumer)
// learns the grant is gone. A supersession one of them observes is seen by
// all: it closes the lease's Lost channel, which they all watch.
type fence struct {
	key        Key
	host       string
	generation uint64
	lease      *lease
	locations  Locations
	clock      Clock
	admissions Admissions

	// mu serialises writes and is held across the store call, so two writes
	// of the same grant land in the order they were made (a heartbeat's
	// republish of `attaching` cannot overwrite `resident`).
	mu         sync.Mutex
	obs        *Observation // last published; nil before attaching
	base       Observation  // runtime fields every publish carries
	tombstoned bool
}

var _ Guard = (*fence)(nil)

func newFence(key Key, host string, gen uint64, l *lease, loc Locations, clock Clock, adm Admissions) *fence {
	return &fence{
		key: key, host: host, generation: gen, lease: l, locations: loc, clock: clock, admissions: adm,
		base: Observation{Tenant: key.Tenant, Session: key.Session, Host: host, Epoch: l.Epoch(), Generation: gen},
	}
}

// Epoch implements Guard.
func (f *fence) Epoch() ResidencyEpoch { return f.lease.Epoch() }

// Check implements Guard.
func (f *fence) Check() error {
	if err := f.lease.valid(); err != nil {
		return fmt.Errorf("%w: %s epoch %d: %w", ErrStaleEpoch, f.key, f.Epoch(), err)
	}
	return nil
}

// Lost closes when the grant is gone, however that was learned.
func (f *fence) Lost() <-chan struct{} { return f.lease.Lost() }

// supersede records that a later epoch was observed.
func (f *fence) supersede(err error) { f.lease.markLost(err) }

// describe sets the runtime fields every later publish carries: the
// workload and what it holds.
func (f *fence) describe(spec noderuntime.WorkloadSpec, compat, namespace string, gpus []string) {
	f.mu.Lock()
	f.base.Workload, f.base.CompatibilityID, f.base.Namespace = spec.ID, compat, namespace
	f.base.CPUMillis, f.base.MemoryBytes, f.base.GPUs = spec.CPUMillis, spec.MemoryBytes, gpus
	f.mu.Unlock()
}

// publish writes the residency in state, under the grant's epoch.
func (f *fence) publish(ctx context.Context, state ObservedState) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.publishLocked(ctx, state)
}

// republish writes the last published state again (the heartbeat), with
// accepting recomputed from the ledger. Nothing published yet, or a
// tombstone already written, makes it a no-op.
func (f *fence) republish(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.obs == nil || f.tombstoned {
		return nil
	}
	return f.publishLocked(ctx, f.obs.State)
}

func (f *fence) publishLocked(ctx context.Context, state ObservedState) error {
	if f.tombstoned {
		return fmt.Errorf("%w: %s epoch %d", ErrTombstoned, f.key, f.Epoch())
	}
	if err := f.Check(); err != nil {
		return err
	}
	o := f.base
	o.State = state
	o.Accepting = state == StateResident && !f.admissions.Draining()
	o.ObservedAt = f.clock.Now()
	if err := f.locations.PublishResidency(ctx, o); err != nil {
		if errors.Is(err, ErrEpochSuperseded) || errors.Is(err, ErrTombstoned) {
			f.supersede(err)
		}
		return err
	}
	f.obs = &o
	return nil
}

// published reports whether anything was published under this grant.
func (f *fence) published() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.obs != nil
}

// tombstone writes the epoch-keeping `expired` tombstone. It does not
// require a live lease (a surrender tombstones its own route best-effort);
// the store refuses it once a later epoch exists, and that refusal is
// returned wrapping ErrEpochSuperseded: the route is not ours to remove.
func (f *fence) tombstone(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tombstoned {
		return nil
	}
	if err := f.locations.TombstoneResidency(ctx, f.key, f.host, f.Epoch()); err != nil {
		if errors.Is(err, ErrEpochSuperseded) {
			f.supersede(err)
		}
		return err
	}
	f.tombstoned = true
	return nil
}

// notOurs reports whether a refusal only says the resource already belongs
// to a later grant: nothing of ours is held, so it is not a leak.
func notOurs(err error) bool {
	return errors.Is(err, ErrEpochSuperseded) || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrTombstoned)
}
