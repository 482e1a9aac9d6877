// Package scheduler drives every Run forward from what is stored: each
// pass sweeps lapsed node leases, repairs missed event publishes, and gives
// each active Run the step its lifecycle stage owes (start it from its
// node's queue, resend or stop it, end it past its start deadline), then
// applies what controlplane/queue plans for the waiting ones: who is
// placed first, who waits on a quota or a budget, whom a preemption
// stops. It also makes intake's early decision.
package scheduler

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/controlplane/queue"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/schemas"
)

// Config tunes the scheduler.
type Config struct {
	// Interval is how often a pass runs without being poked.
	Interval time.Duration
	lifecycle.Timing
	// Placement weighs time against price.
	Placement placement.Config
	// WaitForCapacity keeps a Run that no enrolled node could ever run
	// waiting (for a node to join) instead of failing it at once.
	WaitForCapacity bool
	Now             func() time.Time
	// Policy is the scheduling policy (priority classes, quotas, cohorts,
	// weights, budgets); never nil.
	Policy policy.Source
	// Budgets says whether a tenant is past its budget; nil: no budgets.
	Budgets Budgets
	// Lane is the ephemeral lane; nil: none.
	Lane Lane
}

// Lane runs Runs as one-shot executions on a provider's serverless
// product (controlplane/lane).
type Lane interface {
	// Take books r on the lane when it allows it and the lane starts it
	// sooner than start (seconds until the best node would, +Inf when none
	// takes it now) and than a rental; it reports whether it did.
	Take(ctx context.Context, r schemas.Run, d schemas.BookingDecision, start float64) (bool, error)
	// Owns reports whether r's attempt is booked on the lane, which then
	// owns its steps.
	Owns(r schemas.Run) bool
}

// Budgets reports tenants' spending against their budgets.
type Budgets interface {
	// Over reports whether tenant is past its budget at now, and why
	// (amount spent of the budget, the period), for the Run's wait.
	Over(tenant string, now time.Time) (bool, string)
	// Stops reports whether tenant's running Runs are to be stopped: its
	// spend, read in full, is past a budget that stops running Runs. A
	// spend not known yet never stops one.
	Stops(tenant string, now time.Time) (bool, string)
}

// Renter rents machines for Runs the fleet cannot take now.
type Renter interface {
	// RentFor is asked when no node fits r. It reports whether capacity
	// is coming and, when a known rental is, which one at what stage.
	RentFor(ctx context.Context, r schemas.Run) (coming bool, renting string, err error)
	// RentBeforeQueueing is asked when every node that fits r is busy (d's
	// winner is a queue); true means r waits for a rental instead.
	RentBeforeQueueing(ctx context.Context, r schemas.Run, d schemas.BookingDecision) (bool, error)
}

// LeaseSweeper marks nodes whose lease lapsed as lost and ends the
// attempts booked on them; it reports whether any Run changed.
type LeaseSweeper interface {
	SweepLeases(ctx context.Context, now time.Time, active []*schemas.Run) bool
}

// Scheduler places and drives Runs.
type Scheduler struct {
	cfg      Config
	cache    *cache.Cache
	runs     *runs.Store
	dispatch *dispatch.Dispatcher
	leases   LeaseSweeper
	renter   Renter // nil: no capacity provider
	log      *zap.Logger
	kick     chan struct{}

	// intakeView is the fleet intake decides on; intakeViewMu lets one
	// intake worker at a time take a new one.
	intakeView   atomic.Pointer[intakeView]
	intakeViewMu sync.Mutex

	stats Stats
}

// Stats counts what the scheduler did.
type Stats struct {
	Passes, Decisions, DecisionNanos, PlacementMisses, DecidedAtIntake atomic.Int64
}

// New returns a scheduler; renter is nil without a capacity provider.
func New(cfg Config, c *cache.Cache, store *runs.Store, d *dispatch.Dispatcher, leases LeaseSweeper, renter Renter, log *zap.Logger) *Scheduler {
	return &Scheduler{cfg: cfg, cache: c, runs: store, dispatch: d, leases: leases, renter: renter, log: log, kick: make(chan struct{}, 1)}
}

// Stats returns the scheduler's counters.
func (s *Scheduler) Stats() *Stats { return &s.stats }

// Poke asks for a pass now, without blocking.
func (s *Scheduler) Poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run passes until ctx ends: on a timer and whenever poked.
func (s *Scheduler) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	memo := queue.NewMemo()
	for {
		s.pass(ctx, memo)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
	}
}

// policy is the scheduling policy now (the empty one without a Source).
func (s *Scheduler) policy() *policy.Snapshot {
	if s.cfg.Policy == nil {
		return policy.Static(schemas.SchedulingPolicy{}, "")
	}
	return s.cfg.Policy.Current()
}

// pass gives every active Run the step it is due, oldest first, and
// hands the waiting ones to queue's plan, applied in its order.
func (s *Scheduler) pass(ctx context.Context, memo *queue.Memo) {
	now := s.cfg.Now()
	s.stats.Passes.Add(1)
	active := s.cache.ActiveRuns()
	if s.leases.SweepLeases(ctx, now, active) {
		active = s.cache.ActiveRuns() // attempts were lost: see them as they are now
	}
	s.runs.RepairOutboxes(ctx, active)
	slices.SortFunc(active, func(a, b *schemas.Run) int { return cmp.Compare(a.CreatedAt.UnixNano(), b.CreatedAt.UnixNano()) })
	// The snapshot is built only when a pass has something to place.
	var fleet *placement.Fleet
	snapshot := func() *placement.Fleet {
		if fleet == nil {
			fleet = s.snapshot(active, now)
		}
		return fleet
	}
	var waiting, booked []*schemas.Run
	for _, rp := range active {
		if ctx.Err() != nil {
			return
		}
		if rp.NodeID != "" && rp.Phase != schemas.PhaseAccepted {
			booked = append(booked, rp)
		}
		if s.step(ctx, rp, now, snapshot) {
			waiting = append(waiting, rp)
		}
	}
	pol := s.policy()
	if len(waiting) == 0 && !s.budgetStopsPossible(pol, booked) {
		return
	}
	plan := s.plan(pol, booked, waiting, snapshot(), now, memo)
	for _, err := range plan.Errors {
		s.log.Warn("scheduling pass: no decision", zap.Error(err))
	}
	s.apply(ctx, plan.Actions, pol, snapshot())
}

// plan plans the waiting Runs over fleet (queue.Plan), deciding with this
// scheduler's placement.
func (s *Scheduler) plan(pol *policy.Snapshot, booked, waiting []*schemas.Run, fleet *placement.Fleet, now time.Time, memo *queue.Memo) queue.Result {
	return queue.Plan(queue.Input{Now: now, Policy: pol, Fleet: fleet, Booked: booked, Waiting: waiting, Budget: s.budget(now), BudgetStops: s.budgetStops(now),
		Decide: func(r *schemas.Run, f *placement.Fleet) (schemas.BookingDecision, error) {
			return s.decide(r, f, pol, now)
		},
		UnknownRuntime: s.cfg.Placement.UnknownRuntime, DecideAll: s.renter != nil || s.cfg.Lane != nil}, memo)
}

// step gives r the step it is due, other than placing it; it reports
// whether r waits for a decision.
func (s *Scheduler) step(ctx context.Context, rp *schemas.Run, now time.Time, snapshot func() *placement.Fleet) bool {
	r := *rp
	if s.cfg.Lane != nil && s.cfg.Lane.Owns(r) {
		return false // the lane drives its executions
	}
	var token uint64
	if r.NodeID != "" {
		if n, ok := s.cache.Node(r.NodeID); ok {
			token = n.FencingToken
		}
	}
	var err error
	switch step := lifecycle.Due(r, token, now, s.cfg.Timing); step {
	case lifecycle.StepPlace:
		return true // Due owes no place before the backoff ends
	case lifecycle.StepStartQueued:
		err = s.startQueued(ctx, r, snapshot())
	case lifecycle.StepStop:
		err = s.dispatch.Stop(ctx, r, lifecycle.StopReason(r))
	case lifecycle.StepResend:
		err = s.resend(ctx, r)
	case lifecycle.StepStopOverdue:
		err = s.dispatch.StopAttempt(ctx, r.NodeID, r.ID, r.AttemptID, 0, string(schemas.CodeMaxRuntime))
	case lifecycle.StepDeadline:
		err = s.deadline(ctx, r)
	}
	if err != nil && !errors.Is(err, lifecycle.ErrNoChange) {
		s.log.Warn("scheduling pass", zap.String("run_id", r.ID), zap.String("phase", string(r.Phase)), zap.Error(err))
	}
	return false
}

// budgetStopsPossible reports whether a booked Run's tenant has a budget
// that stops running Runs: the plan must then run even with no Run
// waiting, to stop them once the tenant is past it.
func (s *Scheduler) budgetStopsPossible(pol *policy.Snapshot, booked []*schemas.Run) bool {
	if s.cfg.Budgets == nil {
		return false
	}
	for _, r := range booked {
		if b := pol.Tenant(r.TenantOf()).Budget; b != nil && b.StopRunning && r.Stopping == "" {
			return true
		}
	}
	return false
}

// budgetStops is the plan's view of whose booked Runs their budgets stop
// at now (nil: no budgets).
func (s *Scheduler) budgetStops(now time.Time) func(string) (bool, string) {
	if s.cfg.Budgets == nil {
		return nil
	}
	return func(tenant string) (bool, string) { return s.cfg.Budgets.Stops(tenant, now) }
}

// budget is the plan's view of the tenants' budgets at now (nil: none).
func (s *Scheduler) budget(now time.Time) func(string) (bool, string) {
	if s.cfg.Budgets == nil {
		return nil
	}
	return func(tenant string) (bool, string) { return s.cfg.Budgets.Over(tenant, now) }
}
