package rentals

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/schemas"
)

// The rent-or-queue policy answers two questions the scheduler asks about
// a waiting Run: no node fits it (RentFor), and every node that fits is
// busy (RentBeforeQueueing). Both go through choose: a stopped rental that
// can take the Run comes back warm, so it is preferred; else the cheapest
// available offer; and in the second case only a machine that starts the
// Run sooner than the soonest queue, by more than RentMargin, is taken.

// RentFor asks for a machine for a Run no node fits: it provisions the
// cheapest matching offer unless a rental that could take the Run is
// already on its way. It reports whether capacity is coming and, when a
// known rental is, which one and at what stage, for the Run's waiting
// summary: each stage the rental passes is then one event on the Run. A
// rental the tenant's budget does not allow (Config.Budget, asked with
// the expected cost) is not made: the error wraps a CodeBudget refusal.
func (m *Manager) RentFor(ctx context.Context, r schemas.Run) (bool, string, error) {
	rentals := m.store.list()
	for _, rt := range rentals {
		if inFlight(rt.State) && r.Request.Resources.Fits(rt.Resources) {
			return true, rentalStage(rt.RentalID, rt.State), nil // on its way
		}
	}
	if !m.leading() {
		return true, "", nil // the leading replica decides; the Run waits for it
	}
	// A tenant already past its budget costs no provider call.
	if err := m.withinBudget(r, 0); err != nil {
		return false, "", err
	}
	offers, err := m.offersFor(ctx, r)
	if err != nil {
		return false, "", err
	}
	c := m.choose(rentals, r, offers, math.Inf(1))
	switch {
	case c.resume != nil:
		if err := m.withinBudget(r, c.resume.PricePerHour); err != nil {
			return false, "", err
		}
		return true, "resuming stopped rental " + c.resume.RentalID, m.resume(ctx, r, *c.resume)
	case c.offer == nil:
		return false, "", nil
	case live(rentals) >= m.cfg.MaxRentals:
		m.log.Info("not renting: at the rental limit", zap.String("run_id", r.ID), zap.Int("max_rentals", m.cfg.MaxRentals))
		return true, fmt.Sprintf("at the rental limit (%d live)", m.cfg.MaxRentals), nil
	}
	if err := m.withinBudget(r, offerPrice(c.offer.PricePerHour.MicrosPerHour)); err != nil {
		return false, "", err
	}
	id, err := m.provision(ctx, r, *c.offer)
	if err != nil {
		return true, "", err
	}
	return true, rentalStage(id, schemas.RentalRequested), nil
}

// RentBeforeQueueing is asked when every node that fits r is busy (d's
// winner is a queue). When the soonest start on a busy node is later than a
// fresh machine's time to ready (boot, then a cold pull of the image) by
// more than RentMargin, it rents one — a stopped rental that fits comes
// back first — and r waits for it; the decision, with the numbers, is
// recorded on r's events. It reports whether r waits for a rental; false
// means book the queue, as it does when the tenant's budget does not
// allow the rental.
func (m *Manager) RentBeforeQueueing(ctx context.Context, r schemas.Run, d schemas.BookingDecision) (bool, error) {
	if m.cfg.RentMargin < 0 {
		return false, nil
	}
	queue, pull, ok := queueAndPull(d, m.placement.UnknownImageBytes, m.placement.PullBytesPerSecond)
	margin := m.cfg.RentMargin.Seconds()
	if !ok || pull+margin >= queue {
		return false, nil // not even a machine ready at once would be sooner: no provider call
	}
	if !m.leading() {
		return true, nil // the leading replica decides between renting and queueing
	}
	rentals := m.store.list()
	now := m.now()
	for _, rt := range rentals {
		if rt.ForRun != r.ID {
			continue
		}
		// A rental for r that failed lately is not retried at once: book
		// the queue rather than loop on an out-of-stock offer.
		if rt.State == schemas.RentalFailed && now.Sub(rt.UpdatedAt) < m.cfg.LostAnswerAfter {
			return false, nil
		}
		if inFlight(rt.State) {
			return true, nil // already renting for it; recorded then
		}
	}
	if m.withinBudget(r, 0) != nil {
		return false, nil // no rental for a tenant past its budget: book the queue
	}
	offers, err := m.offersFor(ctx, r)
	if err != nil {
		return false, err
	}
	c := m.choose(rentals, r, offers, queue-pull-margin)
	if c.resume != nil && m.withinBudget(r, c.resume.PricePerHour) != nil ||
		c.resume == nil && c.offer != nil && m.withinBudget(r, offerPrice(c.offer.PricePerHour.MicrosPerHour)) != nil {
		return false, nil
	}
	sooner := func(what string) string {
		return fmt.Sprintf("every node that fits is busy; the soonest starts it in %.0fs; %s in about %.0fs and pulls in %.0fs, sooner by more than the %.0fs margin",
			queue, what, c.ready, pull, margin)
	}
	switch {
	case c.resume != nil:
		if err := m.resume(ctx, r, *c.resume); err != nil {
			return false, err
		}
		return true, m.recordRenting(ctx, r, d, c.resume.RentalID, sooner("stopped rental "+c.resume.RentalID+" resumes")+": resuming it")
	case c.offer == nil || live(rentals) >= m.cfg.MaxRentals:
		return false, nil
	}
	id, err := m.provision(ctx, r, *c.offer)
	if err != nil {
		return false, err
	}
	return true, m.recordRenting(ctx, r, d, id, sooner("offer "+c.offer.ID+" is ready")+": renting it")
}

// choice is what choose picked: a stopped rental to resume, an offer to
// rent, or neither; ready is its estimated seconds to running.
type choice struct {
	resume *schemas.Rental
	offer  *capacity.Offer
	ready  float64
}

// choose picks the machine for r: a stopped rental that can take it, else
// the cheapest available offer; either only when ready before within
// seconds (+Inf: any machine beats none).
func (m *Manager) choose(rentals []schemas.Rental, r schemas.Run, offers []capacity.Offer, within float64) choice {
	if rt, ok := m.stoppedFor(rentals, r, offers); ok {
		ready := m.cfg.ReadyEstimate.Seconds()
		if i := slices.IndexFunc(offers, func(o capacity.Offer) bool { return o.ID == rt.OfferID }); i >= 0 && offers[i].ReadySeconds > 0 {
			ready = float64(offers[i].ReadySeconds)
		}
		if ready < within {
			return choice{resume: &rt, ready: ready}
		}
	}
	available := slices.DeleteFunc(slices.Clone(offers), func(o capacity.Offer) bool { return !o.Available })
	slices.SortStableFunc(available, func(a, b capacity.Offer) int {
		return cmp.Compare(a.PricePerHour.MicrosPerHour, b.PricePerHour.MicrosPerHour)
	})
	for i := range available {
		ready := m.cfg.ReadyEstimate.Seconds()
		if available[i].ReadySeconds > 0 {
			ready = float64(available[i].ReadySeconds)
		}
		if ready < within {
			return choice{offer: &available[i], ready: ready}
		}
	}
	return choice{}
}

// offersFor lists the provider's offers that match r.
func (m *Manager) offersFor(ctx context.Context, r schemas.Run) ([]capacity.Offer, error) {
	offers, err := m.cfg.Provider.ListCapacity(ctx, capacity.OfferQuery{Resources: r.Request.Resources, GPU: r.Request.GPU})
	if err != nil {
		return nil, fmt.Errorf("list offers: %w", err)
	}
	return offers, nil
}

// inFlight reports whether a rental is on its way to becoming a node.
func inFlight(s schemas.RentalState) bool {
	switch s {
	case schemas.RentalRequested, schemas.RentalProvisioning, schemas.RentalBooting, schemas.RentalEnrolling:
		return true
	}
	return false
}

// live counts the rentals not yet done: what MaxRentals bounds.
func live(rentals []schemas.Rental) int {
	n := 0
	for _, rt := range rentals {
		if !rt.State.Done() {
			n++
		}
	}
	return n
}

// rentalStage is how a waiting Run names the rental it waits for.
func rentalStage(id string, state schemas.RentalState) string {
	return "rental " + id + " is " + string(state)
}

// stoppedFor finds a stopped rental that can take r: its provider resumes,
// its machine has r's resources, and its offer still answers r's query (a
// GPU model, say) — or, when the provider no longer lists that offer, r asks
// for no particular GPU.
func (m *Manager) stoppedFor(rentals []schemas.Rental, r schemas.Run, matching []capacity.Offer) (schemas.Rental, bool) {
	if !m.cfg.Provider.Support().Resume {
		return schemas.Rental{}, false
	}
	var best schemas.Rental
	found := false
	for _, rt := range rentals {
		if rt.State != schemas.RentalStopped || rt.NativeRef == "" || !r.Request.Resources.Fits(rt.Resources) {
			continue
		}
		if r.Request.GPU != nil && !slices.ContainsFunc(matching, func(o capacity.Offer) bool { return o.ID == rt.OfferID }) {
			continue
		}
		if !found || rt.PricePerHour < best.PricePerHour || (rt.PricePerHour == best.PricePerHour && rt.RentalID < best.RentalID) {
			best, found = rt, true
		}
	}
	return best, found
}

// recordRenting writes the decision that r waits for rental rentalID
// rather than in a busy node's queue (lifecycle.ForRental).
func (m *Manager) recordRenting(ctx context.Context, r schemas.Run, d schemas.BookingDecision, rentalID, why string) error {
	m.log.Info("renting rather than queueing", zap.String("run_id", r.ID), zap.String("rental_id", rentalID), zap.String("why", why))
	_, err := m.runs.Advance(ctx, r.ID, lifecycle.ForRental(d, rentalID, why), false)
	if errors.Is(err, lifecycle.ErrNoChange) {
		return nil
	}
	return err
}

// queueAndPull reads a decision whose winner is a queue: the soonest start
// on a busy node that fits (seconds), and how long a fresh machine would take
// to pull the image — the size a cold node was quoted, else unknownBytes. It
// answers !ok when some node fits now (it lost on price: not a queue) or
// none fits at all.
func queueAndPull(d schemas.BookingDecision, unknownBytes int64, bytesPerSecond float64) (queue, pull float64, ok bool) {
	queue = -1
	pullBytes := int64(0)
	for _, c := range d.Candidates {
		if c.Eligible {
			if c.Components.QueueSeconds <= 0 {
				return 0, 0, false
			}
			if queue < 0 || c.Components.StartSeconds < queue {
				queue = c.Components.StartSeconds
			}
		}
		if st := c.Components.ImageState; st == string(schemas.LocalityCold) || st == string(schemas.LocalityUnknown) {
			pullBytes = max(pullBytes, c.Components.PullBytes)
		}
	}
	if queue < 0 {
		return 0, 0, false
	}
	if pullBytes == 0 {
		pullBytes = unknownBytes
	}
	return queue, float64(pullBytes) / bytesPerSecond, true
}
