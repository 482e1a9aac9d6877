package rentals

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"go.uber.org/zap"

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
		if inFlight(rt.State) && r.Request.Resources.Fits(rt.Resources) && policyAllows(r.Spot, rt.Interruptible) {
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
	offers, err := m.market.offersFor(ctx, r)
	if err != nil {
		return false, "", err
	}
	c := m.market.choose(rentals, r, offers, math.Inf(1))
	switch {
	case c.resume != nil:
		if err := m.withinBudget(r, c.resume.PricePerHour); err != nil {
			return false, "", err
		}
		return true, "resuming stopped rental " + c.resume.RentalID, m.resume(ctx, r, *c.resume)
	case c.offer == nil && c.limited:
		m.log.Info("not renting: every connection with an offer is at its limit", zap.String("run_id", r.ID), zap.String("why", c.why))
		return true, "at the rental limit: " + c.why, nil
	case c.offer == nil:
		return false, m.market.noOffer(c), nil
	case live(rentals) >= m.cfg.MaxRentals:
		m.log.Info("not renting: at the rental limit", zap.String("run_id", r.ID), zap.Int("max_rentals", m.cfg.MaxRentals))
		return true, fmt.Sprintf("at the rental limit (%d live)", m.cfg.MaxRentals), nil
	}
	if err := m.withinBudget(r, offerPrice(c.offer.PricePerHour.MicrosPerHour)); err != nil {
		return false, "", err
	}
	id, err := m.provision(ctx, r, c.offer, c.why)
	if err != nil {
		return true, "", err
	}
	return true, rentalStage(id, schemas.RentalRequested) + " (" + c.why + ")", nil
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
	offers, err := m.market.offersFor(ctx, r)
	if err != nil {
		return false, err
	}
	c := m.market.choose(rentals, r, offers, queue-pull-margin)
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
	id, err := m.provision(ctx, r, c.offer, c.why)
	if err != nil {
		return false, err
	}
	return true, m.recordRenting(ctx, r, d, id, sooner("offer "+c.offer.ID+" is ready")+": renting it ("+c.why+")")
}

// choice is what choose picked: a stopped rental to resume, an offer to
// rent, or neither; ready is its estimated seconds to running, why how it
// was chosen (or, with neither, what was left out), limited that a
// connection's limit left an offer out.
type choice struct {
	resume  *schemas.Rental
	offer   *offered
	ready   float64
	why     string
	limited bool
}

// choose picks the machine for r: a stopped rental that can take it, else
// the offer of the lowest expected cost (spot.go); either only when ready
// before within seconds (+Inf: any machine beats none).
func (k *market) choose(rentals []schemas.Rental, r schemas.Run, offers []offered, within float64) choice {
	if rt, ok := k.stoppedFor(rentals, r, offers); ok {
		ready := k.cfg.ReadyEstimate.Seconds()
		if i := slices.IndexFunc(offers, offerOf(rt)); i >= 0 && offers[i].ReadySeconds > 0 {
			ready = float64(offers[i].ReadySeconds)
		}
		if ready < within {
			return choice{resume: &rt, ready: ready, why: "stopped rental " + rt.RentalID + " resumes warm"}
		}
	}
	ranked, left, limited := k.rankOffers(rentals, r, offers)
	for _, e := range ranked {
		if e.ready < within {
			return choice{offer: e.offer, ready: e.ready, why: explain(e, ranked, left)}
		}
	}
	return choice{why: strings.Join(left, "; "), limited: limited}
}

// noOffer is what a Run waiting with no offer to rent is told: what was
// left out, and which connections are skipped.
func (k *market) noOffer(c choice) string {
	var parts []string
	if c.why != "" {
		parts = append(parts, c.why)
	}
	for _, k := range k.conns.order {
		if !k.usable() {
			st := k.status(nil)
			parts = append(parts, "connection "+k.ID+" is skipped: "+cmp.Or(st.Error, st.State))
		}
	}
	return strings.Join(parts, "; ")
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
func (k *market) stoppedFor(rentals []schemas.Rental, r schemas.Run, matching []offered) (schemas.Rental, bool) {
	var best schemas.Rental
	found := false
	for _, rt := range rentals {
		if rt.State != schemas.RentalStopped || rt.NativeRef == "" || !r.Request.Resources.Fits(rt.Resources) || !policyAllows(r.Spot, rt.Interruptible) {
			continue
		}
		if c, ok := k.conns.of(rt); !ok || !c.usable() || !c.Provider.Support().Resume {
			continue
		}
		if r.Request.GPU != nil && !slices.ContainsFunc(matching, offerOf(rt)) {
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
