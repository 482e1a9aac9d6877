package rentals

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// Spot capacity is weighed, not preferred: a Run whose policy allows it
// gets spot and on-demand offers listed together, and each is estimated
// for the Run — when it would be ready, and what the Run is expected to
// cost there: price × the Run's expected hold ÷ the chance it finishes
// without an interruption (a Run interrupted runs again). The cheapest
// expected cost wins, the sooner start breaking a tie. A spot pool (region
// and card) whose machine was interrupted lately is left out for
// Config.SpotPenalty, so a Run requeued by an interruption is not rented
// straight back into the pool that lost it; on-demand is then the fallback
// when the Run allows it.

// market is where offers are listed, across connections, and weighed for
// a Run: the Manager's rent-or-queue policy asks it what to rent.
type market struct {
	cfg       *Config
	placement placement.Config
	conns     connections
	now       func() time.Time
	log       *zap.Logger
}

// maxInterruptionChance bounds the chance an estimate uses, so an offer
// certain to be interrupted still has a finite (large) expected cost.
const maxInterruptionChance = 0.9

// offered is one offer and the connection listing it.
type offered struct {
	conn *conn
	capacity.Offer
}

// offerOf matches the offer rt was rented from, on its connection.
func offerOf(rt schemas.Rental) func(offered) bool {
	return func(o offered) bool { return o.conn.ID == connectionOf(rt) && o.ID == rt.OfferID }
}

// estimate is one offer as a candidate for one Run.
type estimate struct {
	offer *offered
	// ready is seconds to running; chance the probability the Run is
	// interrupted there before it ends; cost the expected USD.
	ready, chance, cost float64
}

// offersFor lists, from every usable connection, the offers that match r
// and its spot policy: spot ones only when it allows spot, on-demand ones
// only when it allows on-demand. A connection whose listing fails is left
// out (logged); the error is returned only when every one failed.
func (k *market) offersFor(ctx context.Context, r schemas.Run) ([]offered, error) {
	var out []offered
	var errs []error
	usable := k.conns.ready(ctx, k.now(), k.log)
	for _, c := range usable {
		offers, err := c.Provider.ListCapacity(ctx, capacity.OfferQuery{Resources: r.Request.Resources, GPU: r.Request.GPU, Interruptible: r.Spot.AllowsSpot()})
		if err != nil {
			k.log.Warn("list offers", zap.String("connection_id", c.ID), zap.Error(err))
			errs = append(errs, fmt.Errorf("connection %s: %w", c.ID, err))
			continue
		}
		for _, o := range offers {
			if policyAllows(r.Spot, o.Interruptible) {
				out = append(out, offered{conn: c, Offer: o})
			}
		}
	}
	if len(usable) > 0 && len(errs) == len(usable) {
		return nil, fmt.Errorf("list offers: %w", errors.Join(errs...))
	}
	return out, nil
}

// policyAllows reports whether a Run of policy p may run on capacity that
// is (or is not) interruptible.
func policyAllows(p schemas.SpotPolicy, interruptible bool) bool {
	if interruptible {
		return p.AllowsSpot()
	}
	return p.AllowsOnDemand()
}

// estimateOffer weighs o for r.
func (k *market) estimateOffer(r schemas.Run, o *offered) estimate {
	e := estimate{offer: o, ready: k.cfg.ReadyEstimate.Seconds()}
	if o.ReadySeconds > 0 {
		e.ready = float64(o.ReadySeconds)
	}
	hours := placement.Hold(r.Request, k.placement.UnknownRuntime).Hours()
	if o.Interruptible {
		rate := o.InterruptionRate
		if rate <= 0 || rate >= 1 || math.IsNaN(rate) {
			rate = k.cfg.SpotInterruptionRate
		}
		e.chance = min(1-math.Pow(1-rate, hours), maxInterruptionChance)
	}
	e.cost = offerPrice(o.PricePerHour.MicrosPerHour) * hours / (1 - e.chance)
	return e
}

// rankOffers estimates the available offers for r that are neither
// penalised nor on a connection at its limit, cheapest expected cost first
// (then sooner, then by connection and id), and says why each other one was
// left out; limited reports that a connection's limit left one out.
func (k *market) rankOffers(rentals []schemas.Rental, r schemas.Run, offers []offered) (ranked []estimate, left []string, limited bool) {
	now := k.now()
	for i := range offers {
		o := &offers[i]
		if !o.Available {
			continue
		}
		if why, ok := k.penalised(rentals, o, now); ok {
			left = append(left, why)
			continue
		}
		if o.conn.atLimit(rentals) {
			left = append(left, fmt.Sprintf("offer %s left out: connection %s is at its limit of %d rentals", o.ID, o.conn.ID, o.conn.MaxRentals))
			limited = true
			continue
		}
		ranked = append(ranked, k.estimateOffer(r, o))
	}
	slices.SortStableFunc(ranked, func(a, b estimate) int {
		return cmp.Or(cmp.Compare(a.cost, b.cost), cmp.Compare(a.ready, b.ready), cmp.Compare(a.offer.conn.ID, b.offer.conn.ID), cmp.Compare(a.offer.ID, b.offer.ID))
	})
	return ranked, left, limited
}

// penalised reports whether o is a spot offer of a pool (its connection,
// region and card) one of whose machines was interrupted within
// SpotPenalty of now, and says which.
func (k *market) penalised(rentals []schemas.Rental, o *offered, now time.Time) (string, bool) {
	if !o.Interruptible || k.cfg.SpotPenalty <= 0 {
		return "", false
	}
	for i := range rentals {
		rt := &rentals[i]
		at := rt.InterruptedAt()
		if at.IsZero() || now.Sub(at) >= k.cfg.SpotPenalty || connectionOf(*rt) != o.conn.ID ||
			rt.Region != o.Region || rt.GPUModel != o.GPUModel {
			continue
		}
		return fmt.Sprintf("spot offer %s left out: rental %s was interrupted in its pool (%s) at %s; penalised until %s",
			o.ID, rt.RentalID, schemas.PoolName(o.Region, o.GPUModel), at.UTC().Format(time.RFC3339), at.Add(k.cfg.SpotPenalty).UTC().Format(time.RFC3339)), true
	}
	return "", false
}

// explain says how e was chosen among ranked (and the offers penalised):
// its kind, expected start and cost, and the best offer of the other kind.
func explain(e estimate, ranked []estimate, penalised []string) string {
	s := describe(e)
	for _, o := range ranked {
		if o.offer.Interruptible != e.offer.Interruptible {
			s += "; best " + schemas.CapacityKind(o.offer.Interruptible) + " alternative " + describe(o)
			break
		}
	}
	for _, p := range penalised {
		s += "; " + p
	}
	return s
}

func describe(e estimate) string {
	s := fmt.Sprintf("%s offer %s of connection %s: ready in about %.0fs, expected $%.4f", schemas.CapacityKind(e.offer.Interruptible), e.offer.ID, e.offer.conn.ID, e.ready, e.cost)
	if e.offer.Interruptible {
		s += fmt.Sprintf(" (%.0f%% chance of an interruption)", 100*e.chance)
	}
	return s
}
