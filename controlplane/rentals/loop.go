package rentals

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/connhealth"
	"github.com/warmfleet/warmfleet/schemas"
	"go.uber.org/zap"
)

// Run observes rentals until ctx ends; the janitor runs on its own
// slower cadence inside it.
func (m *Manager) Run(ctx context.Context) {
	cc := m.cfg
	t := time.NewTicker(cc.Interval)
	defer t.Stop()
	var lease *leaderLease
	for lease == nil {
		var err error
		if lease, err = openLeaderLease(ctx, m.conn, cc.LeaderTTL, m.log.Named("rentals")); err != nil {
			m.log.Warn("rental loop: leader lease", zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}
	m.leader.Store(lease)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { lease.run(ctx) })
	lastJanitor := time.Time{}
	for {
		janitor := time.Since(lastJanitor) >= cc.JanitorInterval
		if janitor {
			// Every replica keeps its connections' status current; a
			// failed one may have come back.
			which := connhealth.NotVerified
			if lastJanitor.IsZero() {
				which = connhealth.Every
			}
			m.conns.verify(ctx, which, m.now(), m.log)
		}
		if lease.leading() {
			m.pass(ctx)
			if janitor {
				m.janitor(ctx)
			}
		}
		if janitor {
			lastJanitor = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pass drives every rental not yet done.
func (m *Manager) pass(ctx context.Context) {
	rentals := m.store.list()
	active := m.cache.ActiveRuns()
	for _, rt := range rentals {
		if rt.State.Done() || ctx.Err() != nil {
			continue
		}
		if err := m.drive(ctx, rt, active); err != nil {
			m.log.Warn("rental", zap.String("rental_id", rt.RentalID), zap.String("state", string(rt.State)), zap.Error(err))
		}
	}
}

// drive moves one rental on from what its provider and its node say.
func (m *Manager) drive(ctx context.Context, rt schemas.Rental, active []*schemas.Run) error {
	cc := m.cfg
	now := m.now()
	if rt.NativeRef == "" {
		// The provider's answer never arrived: find the machine by what we
		// told it, or ask again under the same operation key.
		if now.Sub(rt.UpdatedAt) < cc.LostAnswerAfter {
			return nil
		}
		if adopted, err := m.adopt(ctx, rt); err != nil || adopted {
			return err
		}
		return m.askProvider(ctx, rt)
	}
	node, nodeKnown := m.cache.Node(rt.NodeID)
	busy := false
	for _, r := range active {
		if r.NodeID == rt.NodeID && r.Phase != schemas.PhaseAccepted {
			busy = true
		}
	}
	enrolled := nodeKnown && node.RentalID == rt.RentalID && node.Generation == rt.Generation && node.Live(now)
	if enrolled && node.Interruption != nil && checkRentalTransition(rt.State, schemas.RentalInterrupted) == nil {
		// The node's own signal: the provider told the machine it is
		// taking it back, before its API says so.
		return m.end(ctx, rt, schemas.RentalInterrupted, time.Time{}, "its node reported the provider's interruption notice ("+node.Interruption.Source+")")
	}
	if rt.State == schemas.RentalInterrupted {
		return m.reclaim(ctx, rt)
	}
	switch rt.State {
	case schemas.RentalProvisioning, schemas.RentalBooting, schemas.RentalEnrolling:
		if since := stateSince(rt); !enrolled && !since.IsZero() && now.Sub(since) > cc.EnrollTimeout {
			return m.abandon(ctx, rt, fmt.Sprintf("its node did not enroll within %s of the rental becoming %s", cc.EnrollTimeout, rt.State))
		}
	}
	switch rt.State {
	case schemas.RentalEnrolling:
		if enrolled {
			return m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
				if s.State != schemas.RentalEnrolling || s.Generation != node.Generation {
					return bus.ErrNoChange
				}
				s.IdleSince = now
				// The rental became ready when its node enrolled: a moment
				// the control plane recorded itself, not this pass's look.
				return setRentalStateBy(s, schemas.RentalReady, node.EnrolledAt, schemas.StageFromControlPlane, now)
			})
		}
	case schemas.RentalReady, schemas.RentalDraining:
		idleFor := time.Duration(0)
		if !busy && !rt.IdleSince.IsZero() {
			idleFor = now.Sub(rt.IdleSince)
		}
		switch {
		case busy && !rt.IdleSince.IsZero():
			if err := m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, _ time.Time) error { s.IdleSince = time.Time{}; return nil }); err != nil {
				return err
			}
		case !busy && rt.IdleSince.IsZero():
			if err := m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error { s.IdleSince = now; return nil }); err != nil {
				return err
			}
		case !busy && (idleFor >= cc.IdleTimeout || rt.State == schemas.RentalDraining):
			return m.retire(ctx, rt)
		}
	}
	return m.observe(ctx, rt, now)
}

// observe moves rt to the state its provider reports for its machine. A
// machine interrupted, terminated or failed ends the attempts of the Runs
// booked on its node.
func (m *Manager) observe(ctx context.Context, rt schemas.Rental, now time.Time) error {
	cc, err := m.connFor(rt)
	if err != nil {
		return err
	}
	obs, err := cc.Provider.ObserveCapacity(ctx, rentalRef(rt))
	if errors.Is(err, capacity.ErrNotFound) && (rt.State == schemas.RentalTerminating || !cc.Provider.Support().ObserveAfterTerminate) {
		obs, err = capacity.Observation{NativeRef: rt.NativeRef, State: capacity.StateTerminated, ObservedAt: now}, nil
	}
	if err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	if rt.State == schemas.RentalBooting && obs.State == capacity.StateStopped {
		// A resume whose start the provider has not acted on (its answer
		// was lost, or it was refused after the rental moved): ask again.
		return m.startRental(ctx, rt)
	}
	to := rentalStateOf(rt.State, obs)
	if to == "" || to == rt.State {
		return nil
	}
	return m.end(ctx, rt, to, obs.StateSince, "")
}

// end moves rt to to, dated by the provider's since when it gave one;
// why, when given, is recorded on the rental. A move that ends the machine
// (interrupted, terminated, failed) drains its node and then ends the
// attempts of the Runs booked there, so they go back to the queue under
// their retry policy — after the rental is written, so the placement that
// follows already sees an interrupted pool penalised.
func (m *Manager) end(ctx context.Context, rt schemas.Rental, to schemas.RentalState, since time.Time, why string) error {
	ends := to == schemas.RentalInterrupted || to == schemas.RentalTerminated || to == schemas.RentalFailed
	if ends {
		if err := m.drainNode(ctx, rt); err != nil {
			return err
		}
	}
	if to == schemas.RentalInterrupted {
		m.log.Warn("rental interrupted", zap.String("rental_id", rt.RentalID), zap.String("region", rt.Region), zap.String("gpu_model", rt.GPUModel), zap.String("why", why))
	}
	if err := m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
		if s.State != rt.State {
			return bus.ErrNoChange // moved meanwhile; the next pass looks again
		}
		if why != "" {
			s.LastError = why
		}
		return setRentalState(s, to, since, now)
	}); err != nil || !ends {
		return err
	}
	m.loseAttempts(ctx, rt, lossCause(rt.State, to), to)
	return nil
}

// loseAttempts ends the attempts of the Runs booked on rt's node, with
// code, because the rental became to. Runs no longer booked there are left
// alone, so it may be asked again.
func (m *Manager) loseAttempts(ctx context.Context, rt schemas.Rental, code schemas.Code, to schemas.RentalState) {
	var booked []*schemas.Run
	for _, r := range m.cache.ActiveRuns() {
		if r.NodeID == rt.NodeID {
			booked = append(booked, r)
		}
	}
	m.runs.LoseAttempts(ctx, booked, code, func(string) string { return "rental " + rt.RentalID + " is " + string(to) })
}

// reclaim terminates what the provider left of an interrupted machine (a
// stopped spot instance still bills its disk): the rental then ends like
// any terminated one and its slot is free. Terminating a machine already
// gone succeeds.
func (m *Manager) reclaim(ctx context.Context, rt schemas.Rental) error {
	// Again, in case the pass that recorded the interruption stopped
	// before it ended the attempts.
	m.loseAttempts(ctx, rt, schemas.CodeInterrupted, schemas.RentalInterrupted)
	cc, err := m.connFor(rt)
	if err != nil {
		return err
	}
	rc, err := cc.Provider.TerminateCapacity(ctx, capacity.Command{Ref: rentalRef(rt), OperationKey: cycleKey(rt, "interrupted"), Generation: rt.Generation})
	if errors.Is(err, capacity.ErrNotFound) {
		return m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
			if s.State != schemas.RentalInterrupted {
				return bus.ErrNoChange
			}
			return setRentalStateBy(s, schemas.RentalTerminated, time.Time{}, schemas.StageObserved, now)
		})
	}
	if err != nil {
		return fmt.Errorf("terminate interrupted rental %s: %w", rt.RentalID, err)
	}
	return m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
		if s.State != schemas.RentalInterrupted {
			return bus.ErrNoChange
		}
		return setRentalState(s, schemas.RentalTerminating, rc.AcceptedAt, now)
	})
}

// lossCause is why a rental's move from → to ends its node's attempts: a
// provider taking the machine back (interrupted, or terminated without
// our asking) interrupts them (a retry policy's "interrupted"); a machine
// that failed, or that we were terminating, loses them.
func lossCause(from, to schemas.RentalState) schemas.Code {
	if to == schemas.RentalInterrupted || (to == schemas.RentalTerminated && from != schemas.RentalTerminating) {
		return schemas.CodeInterrupted
	}
	return schemas.CodeNodeLost
}

// stateSince is when the rental entered its current state, by its last
// stage; zero when it has none.
func stateSince(rt schemas.Rental) time.Time {
	if n := len(rt.Stages); n > 0 && rt.Stages[n-1].State == rt.State {
		return rt.Stages[n-1].At
	}
	return time.Time{}
}

// janitor lists, on every usable connection, what the provider says we
// own: a machine of a live rental that lost it is adopted; one that
// belongs to no live rental is terminated. Only machines carrying the
// connection's ownership token are touched.
func (m *Manager) janitor(ctx context.Context) {
	for _, c := range m.conns.ready(ctx, m.now(), m.log) {
		if c.Provider.Support().ListOwned {
			m.sweep(ctx, c)
		}
	}
}

// sweep is the janitor's pass over one connection.
func (m *Manager) sweep(ctx context.Context, cc *conn) {
	owned, err := cc.Provider.ListOwnedCapacity(ctx, capacity.OwnershipQuery{ConnectionID: cc.ID, OwnershipToken: cc.OwnershipToken})
	if err != nil {
		m.log.Warn("janitor: list owned capacity", zap.String("connection_id", cc.ID), zap.Error(err))
		return
	}
	for _, o := range owned {
		if o.OwnershipToken != cc.OwnershipToken || o.State.Gone() {
			continue
		}
		var rt schemas.Rental
		_, gerr := bus.GetJSON(ctx, m.store.kv, o.RentalID, &rt)
		switch {
		case gerr == nil && connectionOf(rt) != cc.ID:
			// Another connection's rental: this machine is not it.
		case gerr == nil && !rt.State.Done() && rt.NativeRef == "":
			if _, err := m.adopt(ctx, rt); err != nil {
				m.log.Warn("janitor: adopt", zap.String("rental_id", rt.RentalID), zap.Error(err))
			}
			continue
		case gerr == nil && !rt.State.Done() && rt.NativeRef == o.NativeRef:
			continue // ours and accounted for
		case gerr != nil && !errors.Is(gerr, jetstream.ErrKeyNotFound):
			m.log.Warn("janitor: read rental", zap.String("rental_id", o.RentalID), zap.Error(gerr))
			continue
		}
		m.log.Warn("janitor: terminating an orphan machine", zap.String("native_ref", o.NativeRef), zap.String("rental_id", o.RentalID))
		if _, err := cc.Provider.TerminateCapacity(ctx, capacity.Command{
			Ref:          capacity.Ref{ConnectionID: cc.ID, RentalID: o.RentalID, NativeRef: o.NativeRef, OwnershipToken: o.OwnershipToken},
			OperationKey: "janitor-" + o.NativeRef, Generation: max(o.Generation, 1),
		}); err != nil {
			m.log.Warn("janitor: terminate orphan", zap.String("native_ref", o.NativeRef), zap.Error(err))
		}
	}
}
