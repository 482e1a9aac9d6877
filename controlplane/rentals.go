package controlplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/randid"
	"github.com/warmfleet/warmfleet/schemas"
)

// CapacityConfig lets the control plane rent machines when no node fits.
type CapacityConfig struct {
	Provider     capacity.Provider
	ConnectionID string
	// OwnershipToken marks every machine this deployment rents, so the
	// janitor never touches a machine that merely resembles ours.
	OwnershipToken string
	// MaxRentals bounds machines rented at once (not yet terminated).
	MaxRentals int
	// IdleTimeout retires a ready rental whose node had no Run this long.
	IdleTimeout time.Duration
	// LostAnswerAfter is how long a provision may go unanswered before the
	// provider's owned capacity is searched for it (and, failing that, it is
	// provisioned again under the same operation key).
	LostAnswerAfter time.Duration
	// EnrollTimeout is how long a rental may sit provisioning, booting or
	// enrolling (its node not enrolled) before it is given up and
	// terminated: a machine whose agent never comes (a bad image, a lost
	// disk) must not hold a Run, or a rental slot, forever.
	EnrollTimeout time.Duration
	// JanitorInterval is how often owned capacity is listed to adopt what a
	// rental lost track of and terminate what belongs to no live rental.
	JanitorInterval time.Duration
	// MaxLifetime is passed to providers that can enforce it.
	MaxLifetime time.Duration
	// Interval is how often rentals are observed.
	Interval time.Duration
	// LeaderTTL is the rental loop's leader lease: with several replicas
	// one runs the loop, and another takes over this long after it stops
	// renewing (at once when it stops cleanly).
	LeaderTTL time.Duration
	// ReadyEstimate is assumed for an offer whose provider states no
	// ReadySeconds: how long a new machine takes to run.
	ReadyEstimate time.Duration
	// RentMargin is how much sooner a fresh machine (ready, then pulling
	// the image) must start a Run than the soonest busy node that fits
	// before it is rented instead of queueing; the margin pays for the
	// estimates being estimates. Negative disables renting past a queue.
	RentMargin time.Duration
}

func (c *CapacityConfig) defaults() {
	if c.ConnectionID == "" {
		c.ConnectionID = "default"
	}
	if c.MaxRentals <= 0 {
		c.MaxRentals = 4
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.LostAnswerAfter <= 0 {
		c.LostAnswerAfter = 30 * time.Second
	}
	if c.JanitorInterval <= 0 {
		c.JanitorInterval = time.Minute
	}
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.EnrollTimeout <= 0 {
		c.EnrollTimeout = 20 * time.Minute
	}
	if c.LeaderTTL <= 0 {
		c.LeaderTTL = max(10*time.Second, 5*c.Interval)
	}
	if c.ReadyEstimate <= 0 {
		c.ReadyEstimate = 3 * time.Minute
	}
	if c.RentMargin == 0 {
		c.RentMargin = time.Minute
	}
}

// CodeRentBeatsQueue is the decision code of a Run that waits for a rental
// because a fresh machine starts it sooner than any busy node's queue.
const CodeRentBeatsQueue schemas.Code = "rent_beats_queue"

// rentBeforeQueueing is asked when every node that fits r is busy (d's
// winner is a queue). When the soonest start on a busy node is later than a
// fresh machine's time to ready (boot, then a cold pull of the image) by
// more than RentMargin, it rents one — a stopped rental that fits comes
// back first — and r waits for it; the decision, with the numbers, is
// recorded on r's events. It reports whether r waits for a rental; false
// means book the queue.
func (cp *ControlPlane) rentBeforeQueueing(ctx context.Context, r schemas.Run, d schemas.BookingDecision) (bool, error) {
	cc := cp.cfg.Capacity
	if cc.RentMargin < 0 {
		return false, nil
	}
	queue, pull, ok := queueAndPull(d, cp.cfg.Placement.UnknownImageBytes, cp.cfg.Placement.PullBytesPerSecond)
	if !ok || pull+cc.RentMargin.Seconds() >= queue {
		return false, nil // not even a machine ready at once would be sooner: no provider call
	}
	if !cp.leadsRentals() {
		return true, nil // the leading replica decides between renting and queueing
	}
	rentals, err := cp.listRentals(ctx)
	if err != nil {
		return false, err
	}
	live := 0
	now := cp.now()
	for _, rt := range rentals {
		if rt.State.Done() {
			// A rental for r that failed lately is not retried at once:
			// book the queue rather than loop on an out-of-stock offer.
			if rt.ForRun == r.ID && rt.State == schemas.RentalFailed && now.Sub(rt.UpdatedAt) < cc.LostAnswerAfter {
				return false, nil
			}
			continue
		}
		live++
		switch rt.State {
		case schemas.RentalRequested, schemas.RentalProvisioning, schemas.RentalBooting, schemas.RentalEnrolling:
			if rt.ForRun == r.ID {
				return true, nil // already renting for it; recorded then
			}
		}
	}
	offers, err := cc.Provider.ListCapacity(ctx, capacity.OfferQuery{Resources: r.Request.Resources, GPU: r.Request.GPU})
	if err != nil {
		return false, fmt.Errorf("list offers: %w", err)
	}
	margin := cc.RentMargin.Seconds()
	if rt, ok := cp.stoppedFor(rentals, r, offers); ok {
		ready := cc.ReadyEstimate.Seconds()
		if i := slices.IndexFunc(offers, func(o capacity.Offer) bool { return o.ID == rt.OfferID }); i >= 0 && offers[i].ReadySeconds > 0 {
			ready = float64(offers[i].ReadySeconds)
		}
		if ready+pull+margin < queue {
			why := fmt.Sprintf("every node that fits is busy; the soonest starts it in %.0fs; stopped rental %s resumes in about %.0fs and pulls in %.0fs, sooner by more than the %.0fs margin: resuming it",
				queue, rt.RentalID, ready, pull, margin)
			if err := cp.resume(ctx, r, rt); err != nil {
				return false, err
			}
			return true, cp.recordRenting(ctx, r, d, rt.RentalID, why)
		}
	}
	if live >= cc.MaxRentals {
		return false, nil
	}
	offers = slices.DeleteFunc(offers, func(o capacity.Offer) bool { return !o.Available })
	slices.SortFunc(offers, func(a, b capacity.Offer) int {
		return cmp.Compare(a.PricePerHour.MicrosPerHour, b.PricePerHour.MicrosPerHour)
	})
	for _, o := range offers {
		ready := cc.ReadyEstimate.Seconds()
		if o.ReadySeconds > 0 {
			ready = float64(o.ReadySeconds)
		}
		if ready+pull+margin >= queue {
			continue
		}
		id, err := cp.provision(ctx, r, o)
		if err != nil {
			return false, err
		}
		why := fmt.Sprintf("every node that fits is busy; the soonest starts it in %.0fs; offer %s is ready in about %.0fs and pulls in %.0fs, sooner by more than the %.0fs margin: renting it",
			queue, o.ID, ready, pull, margin)
		return true, cp.recordRenting(ctx, r, d, id, why)
	}
	return false, nil
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

// recordRenting writes the decision that r waits for rental rentalID: no
// winner, and every eligible (busy) node marked with why it lost.
func (cp *ControlPlane) recordRenting(ctx context.Context, r schemas.Run, d schemas.BookingDecision, rentalID, why string) error {
	d.Winner, d.WinnerQueued = "", false
	d.Candidates = slices.Clone(d.Candidates)
	for i := range d.Candidates {
		if c := &d.Candidates[i]; c.Eligible {
			c.Reason, c.Detail = CodeRentBeatsQueue, fmt.Sprintf("busy: starts it in %.0fs; rental %s is sooner", c.Components.StartSeconds, rentalID)
		}
	}
	cp.log.Info("renting rather than queueing", zap.String("run_id", r.ID), zap.String("rental_id", rentalID), zap.String("why", why))
	_, err := cp.advance(ctx, r.ID, func(s *schemas.Run, emit func(schemas.RunEvent)) error {
		if s.Phase != schemas.PhaseAccepted {
			return bus.ErrNoChange
		}
		s.Waiting = "rental " + rentalID
		emit(schemas.RunEvent{Type: schemas.EventDecided, Phase: s.Phase, Code: CodeRentBeatsQueue, Message: why + " (rental " + rentalID + ")", Decision: &d})
		return nil
	})
	if errors.Is(err, bus.ErrNoChange) {
		return nil
	}
	return err
}

// rentFor asks for a machine for a Run no node fits: it provisions the
// cheapest matching offer unless a rental that could take the Run is
// already on its way. It reports whether capacity is coming and, when a
// known rental is, which one and at what stage, for the Run's waiting
// summary: each stage the rental passes is then one event on the Run.
func (cp *ControlPlane) rentFor(ctx context.Context, r schemas.Run) (bool, string, error) {
	cc := cp.cfg.Capacity
	rentals, err := cp.listRentals(ctx)
	if err != nil {
		return false, "", err
	}
	live := 0
	for _, rt := range rentals {
		if rt.State.Done() {
			continue
		}
		live++
		switch rt.State {
		case schemas.RentalRequested, schemas.RentalProvisioning, schemas.RentalBooting, schemas.RentalEnrolling:
			if r.Request.Resources.Fits(rt.Resources) {
				return true, rentalStage(rt.RentalID, rt.State), nil // on its way
			}
		}
	}
	if !cp.leadsRentals() {
		return true, "", nil // the leading replica decides; the Run waits for it
	}
	offers, err := cc.Provider.ListCapacity(ctx, capacity.OfferQuery{Resources: r.Request.Resources, GPU: r.Request.GPU})
	if err != nil {
		return false, "", fmt.Errorf("list offers: %w", err)
	}
	// A stopped rental that fits comes back warm, sooner than a new one.
	if rt, ok := cp.stoppedFor(rentals, r, offers); ok {
		return true, "resuming stopped rental " + rt.RentalID, cp.resume(ctx, r, rt)
	}
	offers = slices.DeleteFunc(offers, func(o capacity.Offer) bool { return !o.Available })
	if len(offers) == 0 {
		return false, "", nil
	}
	if live >= cc.MaxRentals {
		cp.log.Info("not renting: at the rental limit", zap.String("run_id", r.ID), zap.Int("max_rentals", cc.MaxRentals))
		return true, fmt.Sprintf("at the rental limit (%d live)", cc.MaxRentals), nil
	}
	slices.SortFunc(offers, func(a, b capacity.Offer) int { return int(a.PricePerHour.MicrosPerHour - b.PricePerHour.MicrosPerHour) })
	id, err := cp.provision(ctx, r, offers[0])
	if err != nil {
		return true, "", err
	}
	return true, rentalStage(id, schemas.RentalRequested), nil
}

// rentalStage is how a waiting Run names the rental it waits for.
func rentalStage(id string, state schemas.RentalState) string {
	return "rental " + id + " is " + string(state)
}

// provision writes the rental before asking the provider, so a lost answer
// can be found again by its id and operation key.
func (cp *ControlPlane) provision(ctx context.Context, r schemas.Run, offer capacity.Offer) (string, error) {
	cc := cp.cfg.Capacity
	id := randid.Hex("rt-", 6)
	now := cp.now()
	rt := schemas.Rental{
		RentalID: id, ConnectionID: cc.ConnectionID, OfferID: offer.ID, Generation: 1, OwnershipToken: cc.OwnershipToken,
		OperationKey: id + "-g1", NodeID: id, State: schemas.RentalRequested, ForRun: r.ID,
		Resources:    schemas.Resources{CPUMillis: offer.CPUMillis, MemoryBytes: offer.MemoryBytes, GPUCount: offer.GPUCount, DiskBytes: offer.DiskBytes},
		PricePerHour: float64(offer.PricePerHour.MicrosPerHour) / 1e6, Interruptible: offer.Interruptible,
		CreatedAt: now, UpdatedAt: now, Stages: []schemas.RentalStage{{State: schemas.RentalRequested, At: now, Source: schemas.StageFromControlPlane}},
	}
	if _, err := bus.CreateJSON(ctx, cp.rentalsKV, id, &rt); err != nil {
		return "", fmt.Errorf("record rental: %w", err)
	}
	cp.log.Info("renting a machine", zap.String("rental_id", id), zap.String("offer", offer.ID), zap.String("for_run", r.ID))
	return id, cp.askProvider(ctx, rt)
}

// askProvider sends (or resends, under the same operation key) a rental's
// provision with a fresh bootstrap, and records the answer.
func (cp *ControlPlane) askProvider(ctx context.Context, rt schemas.Rental) error {
	cc := cp.cfg.Capacity
	boot, err := cp.invite(ctx, schemas.InviteRequest{NodeID: rt.NodeID, RentalID: rt.RentalID, Generation: rt.Generation, TTLSeconds: 3600})
	if err != nil {
		return err
	}
	rc, err := cc.Provider.ProvisionCapacity(ctx, capacity.ProvisionCommand{
		ConnectionID: cc.ConnectionID, OperationKey: rt.OperationKey, RentalID: rt.RentalID, Generation: rt.Generation,
		OwnershipToken: rt.OwnershipToken, OfferID: rt.OfferID, Resources: rt.Resources, Bootstrap: boot,
		Interruptible: rt.Interruptible, MaxLifetimeSeconds: int64(cc.MaxLifetime / time.Second),
	})
	return cp.updateRental(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
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

// stoppedFor finds a stopped rental that can take r: its provider resumes,
// its machine has r's resources, and its offer still answers r's query (a
// GPU model, say) — or, when the provider no longer lists that offer, r asks
// for no particular GPU.
func (cp *ControlPlane) stoppedFor(rentals []schemas.Rental, r schemas.Run, matching []capacity.Offer) (schemas.Rental, bool) {
	if !cp.cfg.Capacity.Provider.Support().Resume {
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

// resume brings a stopped rental back for r as a new lifecycle cycle: its
// generation rises, then the provider is asked to start it under that
// generation. The machine's agent comes back with the session of the last
// cycle; enrollment moves its node to the new generation (resumeGeneration)
// under a higher fencing token.
func (cp *ControlPlane) resume(ctx context.Context, r schemas.Run, rt schemas.Rental) error {
	var gen uint64
	err := cp.updateRental(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
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
	cp.log.Info("resuming a stopped rental", zap.String("rental_id", rt.RentalID), zap.Uint64("generation", gen), zap.String("for_run", r.ID))
	return cp.startRental(ctx, rt)
}

// startRental asks the provider to start a resumed rental's machine (again,
// under the same operation key, when an earlier answer was lost). A definite
// refusal means the machine cannot come back: it is terminated, and the
// next scheduling pass rents afresh.
func (cp *ControlPlane) startRental(ctx context.Context, rt schemas.Rental) error {
	cc := cp.cfg.Capacity
	_, err := cc.Provider.StartCapacity(ctx, capacity.Command{Ref: rentalRef(rt), OperationKey: cycleKey(rt, "start"), Generation: rt.Generation})
	if err == nil {
		return nil
	}
	if capacity.Ambiguous(err) {
		// The provider may have started it: the next observation says.
		return cp.updateRental(ctx, rt.RentalID, func(s *schemas.Rental, _ time.Time) error { s.LastError = err.Error(); return nil })
	}
	cp.log.Warn("a stopped rental cannot be resumed; terminating it", zap.String("rental_id", rt.RentalID), zap.Error(err))
	if uerr := cp.updateRental(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
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

// resumeGeneration is enrollment's question to the rentals: an agent
// presenting the session of its node's current generation, whose rental
// was resumed from stopped since, is that machine coming back, and its node
// moves to the rental's generation. It answers 0 otherwise. The session may
// have expired while the machine was stopped: the resume itself is the
// authority, and it holds only for the node its rental names, only while
// that resume is under way.
func (cp *ControlPlane) resumeGeneration(ctx context.Context, req schemas.EnrollmentRequest, rec schemas.NodeRecord) uint64 {
	if req.RentalID == "" || rec.RentalID != req.RentalID || req.Generation != rec.Generation {
		return 0
	}
	g := resumeUnderWay(ctx, cp.rentalsKV, rec)
	if g > 0 {
		cp.log.Info("a resumed rental's node re-enrolls under a new generation", zap.String("node_id", req.NodeID),
			zap.String("rental_id", rec.RentalID), zap.Uint64("from", rec.Generation), zap.Uint64("to", g))
	}
	return g
}

// resumeUnderWay answers the generation a node's rental was resumed into,
// when that resume is under way (the rental names this node, is booting or
// enrolling, at a generation above the node's), and 0 otherwise. Both
// enrollment and the NATS auth callout ask it: a resumed machine comes back
// with the session of its last cycle, which may have expired meanwhile.
func resumeUnderWay(ctx context.Context, rentalsKV jetstream.KeyValue, rec schemas.NodeRecord) uint64 {
	if rentalsKV == nil || rec.RentalID == "" {
		return 0
	}
	var rt schemas.Rental
	if _, err := bus.GetJSON(ctx, rentalsKV, rec.RentalID, &rt); err != nil {
		return 0
	}
	if rt.NodeID != rec.NodeID || rt.Generation <= rec.Generation {
		return 0
	}
	if rt.State != schemas.RentalBooting && rt.State != schemas.RentalEnrolling {
		return 0
	}
	return rt.Generation
}

// leadsRentals reports whether this replica runs the rental loop now.
func (cp *ControlPlane) leadsRentals() bool {
	l := cp.rentalLeader.Load()
	return l != nil && l.leading()
}

// ErrRentalMoved reports that a rental changed under a decision about it.
var ErrRentalMoved = errors.New("controlplane: the rental moved meanwhile")

func rentalRef(rt schemas.Rental) capacity.Ref {
	return capacity.Ref{ConnectionID: rt.ConnectionID, RentalID: rt.RentalID, NativeRef: rt.NativeRef, OwnershipToken: rt.OwnershipToken}
}

// cycleKey is the operation key of one act of one lifecycle cycle.
func cycleKey(rt schemas.Rental, act string) string {
	return fmt.Sprintf("%s-g%d-%s", rt.RentalID, rt.Generation, act)
}

// rentalLoop observes rentals until ctx ends; the janitor runs on its own
// slower cadence inside it.
func (cp *ControlPlane) rentalLoop(ctx context.Context) {
	cc := cp.cfg.Capacity
	t := time.NewTicker(cc.Interval)
	defer t.Stop()
	var lease *leaderLease
	for lease == nil {
		var err error
		if lease, err = openLeaderLease(ctx, cp.conn, cc.LeaderTTL, cp.log.Named("rentals")); err != nil {
			cp.log.Warn("rental loop: leader lease", zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}
	cp.rentalLeader.Store(lease)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { lease.run(ctx) })
	lastJanitor := time.Time{}
	for {
		if lease.leading() {
			cp.rentalPass(ctx)
			if time.Since(lastJanitor) >= cc.JanitorInterval {
				cp.janitor(ctx)
				lastJanitor = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (cp *ControlPlane) rentalPass(ctx context.Context) {
	rentals, err := cp.listRentals(ctx)
	if err != nil {
		cp.log.Warn("list rentals", zap.Error(err))
		return
	}
	active := cp.cache.activeRuns()
	for _, rt := range rentals {
		if rt.State.Done() || ctx.Err() != nil {
			continue
		}
		if err := cp.driveRental(ctx, rt, active); err != nil {
			cp.log.Warn("rental", zap.String("rental_id", rt.RentalID), zap.String("state", string(rt.State)), zap.Error(err))
		}
	}
}

// driveRental moves one rental on from what its provider and its node say.
func (cp *ControlPlane) driveRental(ctx context.Context, rt schemas.Rental, active []*schemas.Run) error {
	cc := cp.cfg.Capacity
	now := cp.now()
	if rt.NativeRef == "" {
		// The provider's answer never arrived: find the machine by what we
		// told it, or ask again under the same operation key.
		if now.Sub(rt.UpdatedAt) < cc.LostAnswerAfter {
			return nil
		}
		if adopted, err := cp.adopt(ctx, rt); err != nil || adopted {
			return err
		}
		return cp.askProvider(ctx, rt)
	}
	node, nodeKnown := cp.cache.node(rt.NodeID)
	busy := false
	for _, r := range active {
		if r.NodeID == rt.NodeID && r.Phase != schemas.PhaseAccepted {
			busy = true
		}
	}
	enrolled := nodeKnown && node.RentalID == rt.RentalID && node.Generation == rt.Generation && node.Live(now)
	switch rt.State {
	case schemas.RentalProvisioning, schemas.RentalBooting, schemas.RentalEnrolling:
		if since := stateSince(rt); !enrolled && !since.IsZero() && now.Sub(since) > cc.EnrollTimeout {
			return cp.abandon(ctx, rt, fmt.Sprintf("its node did not enroll within %s of the rental becoming %s", cc.EnrollTimeout, rt.State))
		}
	}
	switch rt.State {
	case schemas.RentalEnrolling:
		if enrolled {
			return cp.updateRental(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
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
			if err := cp.updateRental(ctx, rt.RentalID, func(s *schemas.Rental, _ time.Time) error { s.IdleSince = time.Time{}; return nil }); err != nil {
				return err
			}
		case !busy && rt.IdleSince.IsZero():
			if err := cp.updateRental(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error { s.IdleSince = now; return nil }); err != nil {
				return err
			}
		case !busy && (idleFor >= cc.IdleTimeout || rt.State == schemas.RentalDraining):
			return cp.retire(ctx, rt)
		}
	}
	obs, err := cc.Provider.ObserveCapacity(ctx, capacity.Ref{ConnectionID: rt.ConnectionID, RentalID: rt.RentalID, NativeRef: rt.NativeRef, OwnershipToken: rt.OwnershipToken})
	if errors.Is(err, capacity.ErrNotFound) && (rt.State == schemas.RentalTerminating || !cc.Provider.Support().ObserveAfterTerminate) {
		obs, err = capacity.Observation{NativeRef: rt.NativeRef, State: capacity.StateTerminated, ObservedAt: now}, nil
	}
	if err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	if rt.State == schemas.RentalBooting && obs.State == capacity.StateStopped {
		// A resume whose start the provider has not acted on (its answer
		// was lost, or it was refused after the rental moved): ask again.
		return cp.startRental(ctx, rt)
	}
	to := rentalStateOf(rt.State, obs)
	if to == "" || to == rt.State {
		return nil
	}
	if to == schemas.RentalInterrupted || to == schemas.RentalTerminated || to == schemas.RentalFailed {
		cp.loseNodeRuns(ctx, rt.NodeID, "rental "+rt.RentalID+" is "+string(to))
	}
	return cp.updateRental(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
		if s.State != rt.State {
			return bus.ErrNoChange // moved meanwhile; the next pass looks again
		}
		return setRentalState(s, to, obs.StateSince, now)
	})
}

// stateSince is when the rental entered its current state, by its last
// stage; zero when it has none.
func stateSince(rt schemas.Rental) time.Time {
	if n := len(rt.Stages); n > 0 && rt.Stages[n-1].State == rt.State {
		return rt.Stages[n-1].At
	}
	return time.Time{}
}

// abandon gives up a rental whose machine never became a node: the rental
// records why and terminates it. The next scheduling pass rents afresh.
func (cp *ControlPlane) abandon(ctx context.Context, rt schemas.Rental, why string) error {
	cc := cp.cfg.Capacity
	cp.log.Warn("abandoning a rental", zap.String("rental_id", rt.RentalID), zap.String("state", string(rt.State)), zap.String("why", why))
	// Terminate first: a refusal leaves the rental as it was, and the next
	// pass tries again.
	rc, err := cc.Provider.TerminateCapacity(ctx, capacity.Command{Ref: rentalRef(rt), OperationKey: cycleKey(rt, "abandon"), Generation: rt.Generation})
	if err != nil && !errors.Is(err, capacity.ErrNotFound) {
		return fmt.Errorf("terminate abandoned rental %s: %w", rt.RentalID, err)
	}
	return cp.updateRental(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
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
func (cp *ControlPlane) retire(ctx context.Context, rt schemas.Rental) error {
	cc := cp.cfg.Capacity
	if _, _, err := bus.UpdateJSON(ctx, cp.nodesKV, rt.NodeID, func(n *schemas.NodeRecord) error {
		if n.State == schemas.NodeDraining {
			return bus.ErrNoChange
		}
		n.State = schemas.NodeDraining
		return nil
	}); err != nil && !errors.Is(err, bus.ErrNoChange) && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	sup := cc.Provider.Support()
	cmd := capacity.Command{Ref: rentalRef(rt), OperationKey: cycleKey(rt, "retire"), Generation: rt.Generation}
	to, verb := schemas.RentalTerminating, "terminate"
	var rc capacity.Receipt
	var err error
	if sup.Stop && sup.Resume && sup.PersistentDisk {
		to, verb = schemas.RentalStopping, "stop"
		rc, err = cc.Provider.StopCapacity(ctx, cmd)
	} else {
		rc, err = cc.Provider.TerminateCapacity(ctx, cmd)
	}
	if err != nil {
		return fmt.Errorf("%s idle rental: %w", verb, err)
	}
	cp.log.Info("idle rental retired", zap.String("rental_id", rt.RentalID), zap.String("how", verb))
	return cp.updateRental(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
		// Entered when the provider accepted the command, by its receipt.
		return setRentalState(s, to, rc.AcceptedAt, now)
	})
}

// adopt looks for a rental's machine among the provider's owned capacity.
func (cp *ControlPlane) adopt(ctx context.Context, rt schemas.Rental) (bool, error) {
	cc := cp.cfg.Capacity
	owned, err := cc.Provider.ListOwnedCapacity(ctx, capacity.OwnershipQuery{ConnectionID: rt.ConnectionID, OwnershipToken: rt.OwnershipToken, RentalID: rt.RentalID})
	if err != nil {
		return false, fmt.Errorf("list owned: %w", err)
	}
	for _, o := range owned {
		if o.OwnershipToken != rt.OwnershipToken || o.RentalID != rt.RentalID || o.State.Gone() {
			continue
		}
		cp.log.Info("adopted a machine whose provision answer was lost", zap.String("rental_id", rt.RentalID), zap.String("native_ref", o.NativeRef))
		return true, cp.updateRental(ctx, rt.RentalID, func(s *schemas.Rental, now time.Time) error {
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

// janitor lists what the provider says we own: a machine of a live rental
// that lost it is adopted; one that belongs to no live rental is
// terminated. Only machines carrying our ownership token are touched.
func (cp *ControlPlane) janitor(ctx context.Context) {
	cc := cp.cfg.Capacity
	owned, err := cc.Provider.ListOwnedCapacity(ctx, capacity.OwnershipQuery{ConnectionID: cc.ConnectionID, OwnershipToken: cc.OwnershipToken})
	if err != nil {
		cp.log.Warn("janitor: list owned capacity", zap.Error(err))
		return
	}
	for _, o := range owned {
		if o.OwnershipToken != cc.OwnershipToken || o.State.Gone() {
			continue
		}
		var rt schemas.Rental
		_, gerr := bus.GetJSON(ctx, cp.rentalsKV, o.RentalID, &rt)
		switch {
		case gerr == nil && !rt.State.Done() && rt.NativeRef == "":
			if _, err := cp.adopt(ctx, rt); err != nil {
				cp.log.Warn("janitor: adopt", zap.String("rental_id", rt.RentalID), zap.Error(err))
			}
			continue
		case gerr == nil && !rt.State.Done() && rt.NativeRef == o.NativeRef:
			continue // ours and accounted for
		case gerr != nil && !errors.Is(gerr, jetstream.ErrKeyNotFound):
			cp.log.Warn("janitor: read rental", zap.String("rental_id", o.RentalID), zap.Error(gerr))
			continue
		}
		cp.log.Warn("janitor: terminating an orphan machine", zap.String("native_ref", o.NativeRef), zap.String("rental_id", o.RentalID))
		if _, err := cc.Provider.TerminateCapacity(ctx, capacity.Command{
			Ref:          capacity.Ref{ConnectionID: cc.ConnectionID, RentalID: o.RentalID, NativeRef: o.NativeRef, OwnershipToken: o.OwnershipToken},
			OperationKey: "janitor-" + o.NativeRef, Generation: max(o.Generation, 1),
		}); err != nil {
			cp.log.Warn("janitor: terminate orphan", zap.String("native_ref", o.NativeRef), zap.Error(err))
		}
	}
}

// loseNodeRuns ends the attempts of every Run on a node that is gone.
func (cp *ControlPlane) loseNodeRuns(ctx context.Context, nodeID, why string) {
	for _, r := range cp.cache.activeRuns() {
		if r.NodeID != nodeID || r.Phase == schemas.PhaseAccepted {
			continue
		}
		if _, err := cp.loseAttempt(ctx, *r, why); err != nil && !errors.Is(err, bus.ErrNoChange) {
			cp.log.Warn("lose run attempt", zap.String("run_id", r.ID), zap.Error(err))
		}
	}
}

// updateRental is a CAS update of one rental.
func (cp *ControlPlane) updateRental(ctx context.Context, id string, mutate func(*schemas.Rental, time.Time) error) error {
	now := cp.now()
	_, _, err := bus.UpdateJSON(ctx, cp.rentalsKV, id, func(s *schemas.Rental) error {
		if err := mutate(s, now); err != nil {
			return err
		}
		s.UpdatedAt = now
		return nil
	})
	if errors.Is(err, bus.ErrNoChange) {
		return nil
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

func (cp *ControlPlane) listRentals(ctx context.Context) ([]schemas.Rental, error) {
	lister, err := cp.rentalsKV.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []schemas.Rental
	for k := range lister.Keys() {
		var rt schemas.Rental
		if _, err := bus.GetJSON(ctx, cp.rentalsKV, k, &rt); err == nil {
			out = append(out, rt)
		}
	}
	return out, nil
}
