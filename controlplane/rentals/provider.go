package rentals

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/randid"
	"github.com/warmfleet/warmfleet/schemas"
	"go.uber.org/zap"
)

// provision writes the rental before asking the provider, so a lost answer
// can be found again by its id and operation key.
func (m *Manager) provision(ctx context.Context, r schemas.Run, offer *offered, why string) (string, error) {
	id := randid.Hex("rt-", 6)
	now := m.now()
	rt := schemas.Rental{
		RentalID: id, ConnectionID: offer.conn.ID, OfferID: offer.ID, Generation: 1, OwnershipToken: offer.conn.OwnershipToken,
		OperationKey: id + "-g1", NodeID: id, State: schemas.RentalRequested, ForRun: r.ID,
		Resources:    schemas.Resources{CPUMillis: offer.CPUMillis, MemoryBytes: offer.MemoryBytes, GPUCount: offer.GPUCount, DiskBytes: offer.DiskBytes},
		PricePerHour: float64(offer.PricePerHour.MicrosPerHour) / 1e6, Interruptible: offer.Interruptible,
		Region: offer.Region, GPUModel: offer.GPUModel, Why: why,
		CreatedAt: now, UpdatedAt: now, Stages: []schemas.RentalStage{{State: schemas.RentalRequested, At: now, Source: schemas.StageFromControlPlane}},
	}
	if err := m.store.create(ctx, rt); err != nil {
		return "", fmt.Errorf("record rental: %w", err)
	}
	m.log.Info("renting a machine", zap.String("rental_id", id), zap.String("connection_id", offer.conn.ID), zap.String("offer", offer.ID),
		zap.String("for_run", r.ID), zap.String("why", why))
	return id, m.askProvider(ctx, rt)
}

// askProvider sends (or resends, under the same operation key) a rental's
// provision with a fresh bootstrap, and records the answer.
func (m *Manager) askProvider(ctx context.Context, rt schemas.Rental) error {
	cc := m.cfg
	c, err := m.connFor(rt)
	if err != nil {
		return err
	}
	boot, err := m.inviter.Invite(ctx, schemas.InviteRequest{NodeID: rt.NodeID, RentalID: rt.RentalID, Generation: rt.Generation, TTLSeconds: 3600})
	if err != nil {
		return err
	}
	rc, err := c.Provider.ProvisionCapacity(ctx, capacity.ProvisionCommand{
		ConnectionID: c.ID, OperationKey: rt.OperationKey, RentalID: rt.RentalID, Generation: rt.Generation,
		OwnershipToken: rt.OwnershipToken, OfferID: rt.OfferID, Resources: rt.Resources, Bootstrap: boot,
		Interruptible: rt.Interruptible, MaxLifetimeSeconds: int64(cc.MaxLifetime / time.Second),
	})
	return m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
		if err != nil {
			s.LastError = err.Error()
			if capacity.Ambiguous(err) {
				// The provider may have acted: look for the machine later.
				return setRentalState(s, schemas.RentalProvisioning, time.Time{}, now)
			}
			return setRentalState(s, schemas.RentalFailed, time.Time{}, now)
		}
		s.NativeRef, s.LastError, s.Interruptible = rc.NativeRef, "", rc.Interruptible
		if rc.Pricing.MicrosPerHour > 0 {
			s.PricePerHour = float64(rc.Pricing.MicrosPerHour) / 1e6
		}
		to := rentalStateOf(s.State, capacity.Observation{State: rc.State})
		if to == "" || to == s.State {
			to = schemas.RentalProvisioning
		}
		if to == s.State {
			return nil
		}
		return setRentalState(s, to, rc.AcceptedAt, now)
	})
}

// resume brings a stopped rental back for r as a new lifecycle cycle: its
// generation rises, then the provider is asked to start it under that
// generation. The machine's agent comes back with the session of the last
// cycle; enrollment moves its node to the new generation (resumeGeneration)
// under a higher fencing token.
func (m *Manager) resume(ctx context.Context, r schemas.Run, rt schemas.Rental) error {
	var gen uint64
	err := m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
		if s.State != schemas.RentalStopped {
			return ErrRentalMoved
		}
		s.Generation++
		gen = s.Generation
		s.ForRun, s.IdleSince, s.LastError = r.ID, time.Time{}, ""
		return setRentalStateBy(s, schemas.RentalBooting, now, schemas.StageFromControlPlane, now)
	})
	if err != nil {
		return fmt.Errorf("resume rental %s: %w", rt.RentalID, err)
	}
	rt.Generation = gen
	m.log.Info("resuming a stopped rental", zap.String("rental_id", rt.RentalID), zap.Uint64("generation", gen), zap.String("for_run", r.ID))
	return m.startRental(ctx, rt)
}

// startRental asks the provider to start a resumed rental's machine (again,
// under the same operation key, when an earlier answer was lost). A definite
// refusal means the machine cannot come back: it is terminated, and the
// next scheduling pass rents afresh.
func (m *Manager) startRental(ctx context.Context, rt schemas.Rental) error {
	cc, err := m.connFor(rt)
	if err != nil {
		return err
	}
	_, err = cc.Provider.StartCapacity(ctx, capacity.Command{Ref: rentalRef(rt), OperationKey: cycleKey(rt, "start"), Generation: rt.Generation})
	if err == nil {
		return nil
	}
	if capacity.Ambiguous(err) {
		// The provider may have started it: the next observation says.
		return m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, _ time.Time) error { s.LastError = err.Error(); return nil })
	}
	m.log.Warn("a stopped rental cannot be resumed; terminating it", zap.String("rental_id", rt.RentalID), zap.Error(err))
	if uerr := m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
		if s.Generation != rt.Generation || s.State != schemas.RentalBooting {
			return ErrRentalMoved
		}
		s.LastError = err.Error()
		return setRentalState(s, schemas.RentalTerminating, time.Time{}, now)
	}); uerr != nil {
		return uerr
	}
	if _, terr := cc.Provider.TerminateCapacity(ctx, capacity.Command{Ref: rentalRef(rt), OperationKey: cycleKey(rt, "terminate"), Generation: rt.Generation}); terr != nil {
		return fmt.Errorf("terminate unresumable rental %s: %w", rt.RentalID, terr)
	}
	return nil
}

// abandon gives up a rental whose machine never became a node: the rental
// records why and terminates it. The next scheduling pass rents afresh.
func (m *Manager) abandon(ctx context.Context, rt schemas.Rental, why string) error {
	cc, err := m.connFor(rt)
	if err != nil {
		return err
	}
	m.log.Warn("abandoning a rental", zap.String("rental_id", rt.RentalID), zap.String("state", string(rt.State)), zap.String("why", why))
	// Terminate first: a refusal leaves the rental as it was, and the next
	// pass tries again.
	rc, err := cc.Provider.TerminateCapacity(ctx, capacity.Command{Ref: rentalRef(rt), OperationKey: cycleKey(rt, "abandon"), Generation: rt.Generation})
	if err != nil && !errors.Is(err, capacity.ErrNotFound) {
		return fmt.Errorf("terminate abandoned rental %s: %w", rt.RentalID, err)
	}
	return m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
		if s.State != rt.State || s.Generation != rt.Generation {
			return ErrRentalMoved
		}
		s.LastError = why
		return setRentalState(s, schemas.RentalTerminating, rc.AcceptedAt, now)
	})
}

// retire stops an idle rental where stop, resume and a persistent disk let
// it come back warm, and terminates it otherwise. Its node is drained first
// so nothing new lands on it.
func (m *Manager) retire(ctx context.Context, rt schemas.Rental) error {
	cc, err := m.connFor(rt)
	if err != nil {
		return err
	}
	if err := m.drainNode(ctx, rt); err != nil {
		return err
	}
	sup := cc.Provider.Support()
	cmd := capacity.Command{Ref: rentalRef(rt), OperationKey: cycleKey(rt, "retire"), Generation: rt.Generation}
	to, verb := schemas.RentalTerminating, "terminate"
	var rc capacity.Receipt
	if sup.Stop && sup.Resume && sup.PersistentDisk {
		to, verb = schemas.RentalStopping, "stop"
		rc, err = cc.Provider.StopCapacity(ctx, cmd)
	} else {
		rc, err = cc.Provider.TerminateCapacity(ctx, cmd)
	}
	if err != nil {
		return fmt.Errorf("%s idle rental: %w", verb, err)
	}
	m.log.Info("idle rental retired", zap.String("rental_id", rt.RentalID), zap.String("how", verb))
	return m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
		// Entered when the provider accepted the command, by its receipt.
		return setRentalState(s, to, rc.AcceptedAt, now)
	})
}

// drainNode marks rt's node draining (of this rental's cycle only), so
// nothing new is booked on a machine being retired or taken away.
func (m *Manager) drainNode(ctx context.Context, rt schemas.Rental) error {
	if _, _, err := bus.UpdateJSON(ctx, m.nodesKV, rt.NodeID, func(n *schemas.NodeRecord) error {
		if n.State == schemas.NodeDraining || n.State == schemas.NodeLost || n.RentalID != rt.RentalID || n.Generation != rt.Generation {
			return bus.ErrNoChange
		}
		n.State = schemas.NodeDraining
		return nil
	}); err != nil && !errors.Is(err, bus.ErrNoChange) && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("drain node %s: %w", rt.NodeID, err)
	}
	return nil
}

// adopt looks for a rental's machine among the provider's owned capacity.
func (m *Manager) adopt(ctx context.Context, rt schemas.Rental) (bool, error) {
	cc, err := m.connFor(rt)
	if err != nil {
		return false, err
	}
	owned, err := cc.Provider.ListOwnedCapacity(ctx, capacity.OwnershipQuery{ConnectionID: rt.ConnectionID, OwnershipToken: rt.OwnershipToken, RentalID: rt.RentalID})
	if err != nil {
		return false, fmt.Errorf("list owned: %w", err)
	}
	for _, o := range owned {
		if o.OwnershipToken != rt.OwnershipToken || o.RentalID != rt.RentalID || o.State.Gone() {
			continue
		}
		m.log.Info("adopted a machine whose provision answer was lost", zap.String("rental_id", rt.RentalID), zap.String("native_ref", o.NativeRef))
		return true, m.store.update(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
			if s.NativeRef != "" {
				return bus.ErrNoChange
			}
			s.NativeRef, s.LastError = o.NativeRef, ""
			if to := rentalStateOf(s.State, capacity.Observation{State: o.State}); to != "" && to != s.State {
				return setRentalState(s, to, time.Time{}, now)
			}
			return nil
		})
	}
	return false, nil
}

// connFor is the connection rt was made through, or an error naming it
// when this control plane no longer has it configured (the rental is left
// as it is; the janitor of a control plane that has it still sees it).
func (m *Manager) connFor(rt schemas.Rental) (*conn, error) {
	c, ok := m.conns.of(rt)
	if !ok {
		return nil, fmt.Errorf("rental %s: connection %q is not configured: %w", rt.RentalID, rt.ConnectionID, ErrUnknownConnection)
	}
	return c, nil
}

// ErrUnknownConnection reports a rental of a connection not configured.
var ErrUnknownConnection = errors.New("rentals: unknown provider connection")

// ErrRentalMoved reports that a rental changed under a decision about it.
var ErrRentalMoved = errors.New("rentals: the rental moved meanwhile")

func rentalRef(rt schemas.Rental) capacity.Ref {
	return capacity.Ref{ConnectionID: rt.ConnectionID, RentalID: rt.RentalID, NativeRef: rt.NativeRef, OwnershipToken: rt.OwnershipToken}
}

// cycleKey is the operation key of one act of one lifecycle cycle.
func cycleKey(rt schemas.Rental, act string) string {
	return fmt.Sprintf("%s-g%d-%s", rt.RentalID, rt.Generation, act)
}
