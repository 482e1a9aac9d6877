package scheduler

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// place books an accepted Run on the best node — now, or in a busy node's
// queue when waiting there beats starting cold elsewhere — or records why
// none fits (once per distinct answer). A Run no node could ever run fails
// at once unless the scheduler waits for capacity.
func (s *Scheduler) place(ctx context.Context, r schemas.Run, fleet *placement.Fleet, now time.Time) error {
	d, err := s.decide(&r, fleet, now)
	if err != nil {
		return err
	}
	if d.Winner == "" {
		return s.wait(ctx, r, d)
	}
	if d.WinnerQueued && s.renter != nil {
		// Every node that fits is busy: a fresh machine may start it sooner.
		if renting, err := s.renter.RentBeforeQueueing(ctx, r, d); renting || err != nil {
			return err
		}
	}
	winner := fleet.Node(d.Winner).Record
	run, err := s.runs.Advance(ctx, r.ID, lifecycle.Placement{
		NodeID: winner.NodeID, FencingToken: winner.FencingToken, Generation: winner.Generation, Queued: d.WinnerQueued, GPUs: d.GPUs, Decision: d,
	}, false)
	if err != nil {
		return err
	}
	fleet.Book(winner.NodeID, s.booking(&run, now), run.Queued)
	s.log.Info("run placed", zap.String("run_id", r.ID), zap.String("node_id", winner.NodeID), zap.Int("attempt", run.Attempt), zap.Bool("queued", run.Queued))
	if run.Queued {
		return s.dispatch.Prepare(ctx, run)
	}
	return s.dispatch.Launch(ctx, run)
}

// wait records that no node takes r now, renting capacity for it when a
// provider is configured; it fails r when no node ever could.
func (s *Scheduler) wait(ctx context.Context, r schemas.Run, d schemas.BookingDecision) error {
	coming, renting := false, ""
	if s.renter != nil {
		var err error
		if coming, renting, err = s.renter.RentFor(ctx, r); err != nil {
			s.log.Warn("renting capacity", zap.String("run_id", r.ID), zap.Error(err))
			coming = true // try again next pass rather than fail the Run
		}
	}
	w := lifecycle.NoNodeFits(d, renting)
	var t lifecycle.Transition = w
	switch {
	case !s.cfg.WaitForCapacity && !coming && unsatisfiable(d):
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
	return s.dispatch.Launch(ctx, run)
}

// decide makes one placement decision for r's next attempt over fleet,
// and counts it (and a miss, when no node wins).
func (s *Scheduler) decide(r *schemas.Run, fleet *placement.Fleet, now time.Time) (schemas.BookingDecision, error) {
	ref, err := schemas.ParseImageRef("image", r.Request.Image)
	if err != nil {
		return schemas.BookingDecision{}, err
	}
	start := time.Now()
	d := placement.Decide(placement.Request{RunID: r.ID, Attempt: r.Attempt + 1, Run: r.Request, Digest: ref.Digest, Artifacts: r.Artifacts}, fleet, now, s.cfg.Placement)
	s.stats.DecisionNanos.Add(time.Since(start).Nanoseconds())
	s.stats.Decisions.Add(1)
	if d.Winner == "" {
		s.stats.PlacementMisses.Add(1)
	}
	return d, nil
}
