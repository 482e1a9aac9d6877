package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/controlplane/queue"
	"github.com/warmfleet/warmfleet/controlplane/usage"
	"github.com/warmfleet/warmfleet/schemas"
)

// apply carries out a planned pass in its order. A step that fails is
// logged; the next pass plans again from what is stored.
func (s *Scheduler) apply(ctx context.Context, actions []queue.Action, pol *policy.Snapshot, fleet *placement.Fleet) {
	for _, a := range actions {
		if ctx.Err() != nil {
			return
		}
		var err error
		switch a.Kind {
		case queue.KindPlace:
			err = s.place(ctx, *a.Run, a, pol, fleet)
		case queue.KindWait:
			err = s.waitFor(ctx, *a.Run, a)
		case queue.KindPreempt:
			err = s.preempt(ctx, a)
		case queue.KindBudgetStop:
			err = s.budgetStop(ctx, *a.Run, a.Message)
		}
		if err != nil && !errors.Is(err, lifecycle.ErrNoChange) {
			s.log.Warn("scheduling pass", zap.String("run_id", a.Run.ID), zap.String("action", string(a.Kind)), zap.Error(err))
		}
	}
}

// place books r on the plan's winner — now, or in a busy node's queue when
// waiting there beats starting cold elsewhere — priced at the winner's
// rate for what r holds.
func (s *Scheduler) place(ctx context.Context, r schemas.Run, a queue.Action, pol *policy.Snapshot, fleet *placement.Fleet) error {
	d := a.Decision
	if took, err := s.toLane(ctx, r, d, winnerStart(d)); took || err != nil {
		return err
	}
	if d.WinnerQueued && s.renter != nil {
		// Every node that fits is busy: a fresh machine may start it sooner.
		if renting, err := s.renter.RentBeforeQueueing(ctx, r, d); renting || (err != nil && !budgetRefused(err)) {
			return err
		}
	}
	winner := fleet.Node(d.Winner).Record
	run, err := s.runs.Advance(ctx, r.ID, lifecycle.Placement{
		NodeID: winner.NodeID, FencingToken: winner.FencingToken, Generation: winner.Generation, Queued: d.Queues(),
		AwaitsBytes: d.FetchFirst, ReadyBy: placement.ReadyAt(d, s.cfg.Now()), GPUs: d.GPUs, Decision: d,
		PricePerHour: usage.Price(winner, r.Request.Resources, a.GPUModel, pol), GPUModel: a.GPUModel,
	}, false)
	if err != nil {
		return err
	}
	s.log.Info("run placed", zap.String("run_id", r.ID), zap.String("node_id", winner.NodeID), zap.Int("attempt", run.Attempt), zap.Bool("queued", run.Queued))
	if run.Queued {
		return s.dispatch.Prepare(ctx, run)
	}
	return s.dispatch.Launch(ctx, run)
}

// waitFor records a planned wait: a capacity one as wait does, any other
// (quota, budget, preempting) as the plan says.
func (s *Scheduler) waitFor(ctx context.Context, r schemas.Run, a queue.Action) error {
	if a.Code == schemas.CodeNoCapacity {
		return s.wait(ctx, r, a.Decision)
	}
	if r.Waiting == a.Summary {
		return nil
	}
	d := a.Decision
	d.RunID, d.Attempt, d.DecidedAt = r.ID, r.Attempt+1, s.cfg.Now()
	_, err := s.runs.Advance(ctx, r.ID, lifecycle.Wait{Decision: d, Summary: a.Summary, Code: a.Code, Message: a.Message}, false)
	return err
}

// wait records that no node takes r now, renting capacity for it when a
// provider is configured; it fails r when no node ever could. A provider
// that refuses for r's tenant's budget leaves r waiting on the budget.
func (s *Scheduler) wait(ctx context.Context, r schemas.Run, d schemas.BookingDecision) error {
	if took, err := s.toLane(ctx, r, d, math.Inf(1)); took || err != nil {
		return err
	}
	coming, renting := false, ""
	if s.renter != nil {
		var err error
		if coming, renting, err = s.renter.RentFor(ctx, r); budgetRefused(err) {
			return s.waitFor(ctx, r, queue.Action{Code: schemas.CodeBudget, Decision: d, Summary: "budget: no rental for tenant " + r.TenantOf(),
				Message: "no node fits now, and no rental: " + schemas.AsRefusal(err).Reason})
		} else if err != nil {
			s.log.Warn("renting capacity", zap.String("run_id", r.ID), zap.Error(err))
			coming = true // try again next pass rather than fail the Run
		}
	}
	w := lifecycle.NoNodeFits(d, renting)
	var t lifecycle.Transition = w
	switch {
	case !s.cfg.WaitForCapacity && !coming && queue.Unsatisfiable(d):
		t = lifecycle.Unsatisfiable{Decision: d, Summary: w.Summary}
	case r.Waiting == w.Summary:
		// Same answer as last pass, already recorded: no KV read, no
		// event. r is the cached Run; if it is stale the next pass sees
		// the newer one.
		return nil
	}
	_, err := s.runs.Advance(ctx, r.ID, t, false)
	return err
}

// toLane offers r to the ephemeral lane, when there is one, against a
// node that starts it in start seconds.
func (s *Scheduler) toLane(ctx context.Context, r schemas.Run, d schemas.BookingDecision, start float64) (bool, error) {
	if s.cfg.Lane == nil {
		return false, nil
	}
	d.RunID, d.Attempt, d.DecidedAt = r.ID, r.Attempt+1, s.cfg.Now()
	return s.cfg.Lane.Take(ctx, r, d, start)
}

// winnerStart is when d's winner would start its Run, in seconds.
func winnerStart(d schemas.BookingDecision) float64 {
	for _, c := range d.Candidates {
		if c.NodeID == d.Winner {
			return c.Components.StartSeconds
		}
	}
	return math.Inf(1)
}

// budgetRefused reports whether err is a capacity provider's refusal for
// the tenant's budget.
func budgetRefused(err error) bool {
	var ref *schemas.Refusal
	return errors.As(err, &ref) && ref.Code == schemas.CodeBudget
}

// preempt stops the plan's victims, each with its own grace, and records
// that the preemptor waits for them.
func (s *Scheduler) preempt(ctx context.Context, a queue.Action) error {
	for _, v := range a.Victims {
		run, err := s.stop(ctx, v.RunID, lifecycle.Preemption{AttemptID: v.Run.AttemptID, By: a.Run.ID, Why: v.Why})
		if err != nil {
			return err
		}
		s.log.Info("run preempted", zap.String("run_id", v.RunID), zap.String("by", a.Run.ID), zap.String("why", v.Why), zap.String("node_id", run.NodeID))
	}
	return s.waitFor(ctx, *a.Run, a)
}

// budgetStop stops r, whose tenant is past a budget that stops running
// Runs.
func (s *Scheduler) budgetStop(ctx context.Context, r schemas.Run, why string) error {
	_, err := s.stop(ctx, r.ID, lifecycle.BudgetStop{AttemptID: r.AttemptID, Why: why})
	return err
}

// deadline ends r, not started by its start deadline: at once when it
// holds nothing, else by stopping its attempt.
func (s *Scheduler) deadline(ctx context.Context, r schemas.Run) error {
	_, err := s.stop(ctx, r.ID, lifecycle.DeadlineExceeded{})
	return err
}

// stop applies t, a control-plane stop, to Run runID and, when the Run's
// attempt is left stopping, asks its node to stop it with the Run's grace.
func (s *Scheduler) stop(ctx context.Context, runID string, t lifecycle.Transition) (schemas.Run, error) {
	run, err := s.runs.Advance(ctx, runID, t, false)
	if err != nil || run.Stopping == "" {
		return run, err
	}
	return run, s.dispatch.Stop(ctx, run, lifecycle.StopReason(run))
}

// startQueued launches a queued Run once it heads its node's queue and
// fits beside what runs there.
func (s *Scheduler) startQueued(ctx context.Context, r schemas.Run, fleet *placement.Fleet) error {
	n := fleet.Node(r.NodeID)
	if n == nil || !n.CanStart(r.ID) {
		return nil
	}
	gpus, _, ok := n.PickGPUs(r.Request.Resources.GPUCount, r.Request.GPU)
	if !ok {
		return nil
	}
	run, err := s.runs.Advance(ctx, r.ID, lifecycle.QueueStart{AttemptID: r.AttemptID, GPUs: gpus}, false)
	if err != nil {
		return err
	}
	fleet.Start(r.NodeID, r.ID, run.GPUs)
	return s.dispatch.Launch(ctx, run)
}

// resend sends the attempt's launch commands again under its node's
// current session, and records the session they now carry.
func (s *Scheduler) resend(ctx context.Context, r schemas.Run) error {
	n, ok := s.cache.Node(r.NodeID)
	if !ok || !n.Live(s.cfg.Now()) {
		return nil // the lease sweep will move the Run on
	}
	run, err := s.runs.Advance(ctx, r.ID, lifecycle.Restamp{AttemptID: r.AttemptID, FencingToken: n.FencingToken, Generation: n.Generation}, false)
	if errors.Is(err, lifecycle.ErrNoChange) {
		return nil
	}
	if err != nil {
		return err
	}
	s.log.Info("resending commands", zap.String("run_id", r.ID), zap.String("node_id", r.NodeID), zap.Uint64("fencing_token", n.FencingToken))
	if run.Queued {
		return s.dispatch.Prepare(ctx, run)
	}
	return s.dispatch.Launch(ctx, run)
}

// decide makes one placement decision for r's next attempt over fleet
// under pol, every node an earlier attempt failed on penalised, and counts
// it (and a miss, when no node wins).
func (s *Scheduler) decide(r *schemas.Run, fleet *placement.Fleet, pol *policy.Snapshot, now time.Time) (schemas.BookingDecision, error) {
	ref, err := schemas.ParseImageRef("image", r.Request.Image)
	if err != nil {
		return schemas.BookingDecision{}, fmt.Errorf("run %s: %w", r.ID, err)
	}
	cfg := s.cfg.Placement
	if price := pol.GPUHourPrice; price > 0 {
		cfg.GPUHourPrice = price // the policy's price of a card held idle
	}
	start := time.Now()
	d := placement.Decide(placement.Request{RunID: r.ID, Attempt: r.Attempt + 1, Run: r.Request, Digest: ref.Digest, Artifacts: r.Artifacts, Spot: r.Spot,
		Penalties: penalties(r.Attempts)}, fleet, now, cfg)
	s.stats.DecisionNanos.Add(time.Since(start).Nanoseconds())
	s.stats.Decisions.Add(1)
	if d.Winner == "" {
		s.stats.PlacementMisses.Add(1)
	}
	return d, nil
}

// penalties names each node an earlier attempt failed on, and how (nil
// when none did): preempted attempts and successes are no failure.
func penalties(attempts []schemas.AttemptRecord) map[string]string {
	var p map[string]string
	for _, a := range attempts {
		if a.Outcome == "" || a.Outcome == "succeeded" || a.Outcome == schemas.CodePreempted || a.NodeID == "" {
			continue
		}
		if p == nil {
			p = map[string]string{}
		}
		p[a.NodeID] = fmt.Sprintf("attempt %d failed here: %s", a.Attempt, a.Outcome)
	}
	return p
}
