package controlplane

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// reconcileLoop drives every Run forward from what is stored, not from what
// this replica remembers, so a restarted or second replica picks up where
// another stopped. It runs on a timer and whenever intake or enrollment
// pokes it.
func (cp *ControlPlane) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(cp.cfg.ReconcileInterval)
	defer t.Stop()
	memo := newDecisionMemo()
	for {
		cp.reconcileOnce(ctx, memo)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-cp.kick:
		}
	}
}

func (cp *ControlPlane) reconcileOnce(ctx context.Context, memo *decisionMemo) {
	now := cp.now()
	cp.metrics.passes.Add(1)
	runs := cp.cache.activeRuns()
	if cp.expireLeases(ctx, now, runs) {
		runs = cp.cache.activeRuns() // attempts were lost: see them as they are now
	}
	cp.repairOutboxes(ctx, runs)
	slices.SortFunc(runs, func(a, b *schemas.Run) int { return cmp.Compare(a.CreatedAt.UnixNano(), b.CreatedAt.UnixNano()) })
	// Renting makes a waiting Run's answer move with the rental, not the
	// fleet, so with a provider every waiting Run is decided every pass.
	memoOK := cp.cfg.Capacity == nil
	fleetKey := memo.fleetKey(cp.cache.nodeVersion(), runs)
	defer memo.endPass()
	// The snapshot is built only when a pass has something to place.
	var fleet *placement.Fleet
	snapshot := func() *placement.Fleet {
		if fleet == nil {
			fleet = cp.snapshot(runs, now)
		}
		return fleet
	}
	for _, rp := range runs {
		if ctx.Err() != nil {
			return
		}
		if rp.Phase == schemas.PhaseAccepted && memoOK && memo.fresh(rp, fleetKey, now) {
			continue
		}
		r := *rp
		var err error
		switch {
		case r.Phase == schemas.PhaseAccepted:
			if err = cp.schedule(ctx, r, snapshot(), now); err == nil {
				memo.decided(r.ID, fleetKey, now)
			}
		case r.Queued && !r.CancelRequested:
			err = cp.startQueued(ctx, r, snapshot())
		case r.CancelRequested:
			if now.Sub(r.PhaseSince) > cp.cfg.RedispatchAfter {
				err = cp.sendStop(ctx, r, "cancelled")
			}
		case cp.nodeSuperseded(r):
			// The node re-enrolled since these commands were sent: resend
			// under its current session. Operation ids are unchanged, so the
			// node applies each once.
			err = cp.resend(ctx, r)
		case r.Queued:
		case r.Phase != schemas.PhaseRunning && now.Sub(r.PhaseSince) > cp.cfg.RedispatchAfter:
			err = cp.resend(ctx, r)
		case r.Phase == schemas.PhaseRunning && r.Request.MaxRuntimeSeconds > 0 &&
			now.Sub(r.PhaseSince) > time.Duration(r.Request.MaxRuntimeSeconds)*time.Second+cp.cfg.MaxRuntimeSlack:
			err = cp.sendStopAttempt(ctx, r.NodeID, r.ID, r.AttemptID, 0, string(schemas.CodeMaxRuntime))
		}
		if err != nil && !errors.Is(err, bus.ErrNoChange) {
			cp.log.Warn("reconcile run", zap.String("run_id", r.ID), zap.String("phase", string(r.Phase)), zap.Error(err))
		}
	}
}

// nodeSuperseded reports whether the Run's commands carry an older fencing
// token than its node now has.
func (cp *ControlPlane) nodeSuperseded(r schemas.Run) bool {
	n, ok := cp.cache.node(r.NodeID)
	return ok && n.FencingToken > r.FencingToken
}

// resend sends the attempt's launch commands again and records the token
// they now carry.
func (cp *ControlPlane) resend(ctx context.Context, r schemas.Run) error {
	n, ok := cp.cache.node(r.NodeID)
	if !ok || !n.Live(cp.now()) {
		return nil // the lease sweep will move the Run on
	}
	run, err := cp.advance(ctx, r.ID, func(s *schemas.Run, _ func(schemas.RunEvent)) error {
		if s.AttemptID != r.AttemptID || s.Phase.Terminal() {
			return errSkip
		}
		s.FencingToken, s.Generation = n.FencingToken, n.Generation
		return nil
	})
	if errors.Is(err, errSkip) {
		return nil
	}
	if err != nil {
		return err
	}
	cp.log.Info("resending commands", zap.String("run_id", r.ID), zap.String("node_id", r.NodeID), zap.Uint64("fencing_token", n.FencingToken))
	return cp.sendLaunch(ctx, run)
}

var errSkip = errors.New("skip")

// schedule books an accepted Run on the best node — now, or in a busy
// node's queue when waiting there beats starting cold elsewhere — or records
// why none fits (once per distinct answer). A Run no node could ever run
// fails at once unless the control plane waits for capacity.
func (cp *ControlPlane) schedule(ctx context.Context, r schemas.Run, fleet *placement.Fleet, now time.Time) error {
	d, err := cp.decide(&r, fleet, now)
	if err != nil {
		return err
	}
	if d.Winner == "" {
		coming, renting := false, ""
		if cp.cfg.Capacity != nil {
			var err error
			if coming, renting, err = cp.rentFor(ctx, r); err != nil {
				cp.log.Warn("renting capacity", zap.String("run_id", r.ID), zap.Error(err))
				coming = true // try again next pass rather than fail the Run
			}
		}
		fail := !cp.cfg.WaitForCapacity && !coming && unsatisfiable(d)
		summary, waitMsg := waitingSummary(d), msgNoNodeFits
		if renting != "" {
			summary += " " + renting
			waitMsg += " for capacity: " + renting
		}
		if !fail && r.Waiting == summary {
			// Same answer as last pass, already recorded: no KV read, no
			// event. r is the cached Run; if it is stale the next pass sees
			// the newer one.
			return nil
		}
		_, err := cp.advance(ctx, r.ID, func(s *schemas.Run, emit func(schemas.RunEvent)) error {
			if s.Phase != schemas.PhaseAccepted || (!fail && s.Waiting == summary) {
				return bus.ErrNoChange
			}
			s.Waiting = summary
			if fail {
				emit(schemas.RunEvent{Type: schemas.EventDecided, Phase: s.Phase, Code: schemas.CodeUnsatisfiable, Message: "no enrolled node can ever run this request", Decision: &d})
				s.Phase, s.Reason = schemas.PhaseFailed, string(schemas.CodeUnsatisfiable)
				emit(phaseEvent(s, schemas.PhaseAccepted, schemas.CodeUnsatisfiable, "every node rejects it for a reason waiting will not change; see the decision"))
				return nil
			}
			emit(schemas.RunEvent{Type: schemas.EventDecided, Phase: s.Phase, Code: schemas.CodeNoCapacity, Message: waitMsg, Decision: &d})
			return nil
		})
		return err
	}
	if d.WinnerQueued && cp.cfg.Capacity != nil {
		// Every node that fits is busy: a fresh machine may start it sooner.
		if renting, err := cp.rentBeforeQueueing(ctx, r, d); renting || err != nil {
			return err
		}
	}
	winner := fleet.Node(d.Winner).Record
	run, err := cp.advance(ctx, r.ID, func(s *schemas.Run, emit func(schemas.RunEvent)) error {
		if s.Phase != schemas.PhaseAccepted {
			return bus.ErrNoChange
		}
		s.Attempt++
		s.NodeID, s.AttemptID, s.Waiting, s.Queued = winner.NodeID, schemas.WorkloadID(s.ID, s.Attempt), "", d.WinnerQueued
		s.FencingToken, s.Generation = winner.FencingToken, winner.Generation
		s.Phase = schemas.PhasePlaced
		emit(schemas.RunEvent{Type: schemas.EventDecided, Phase: schemas.PhaseAccepted, NodeID: winner.NodeID, Attempt: s.Attempt, Decision: &d})
		msg := "booked on " + winner.NodeID
		if s.Queued {
			msg += ", queued behind its running work; prefetching the image"
		}
		emit(phaseEvent(s, schemas.PhaseAccepted, "", msg))
		return nil
	})
	if err != nil {
		return err
	}
	fleet.Book(winner.NodeID, placement.Booking{RunID: r.ID, Resources: r.Request.Resources, ExpectedEnd: cp.expectedEnd(run, now)}, run.Queued)
	cp.log.Info("run placed", zap.String("run_id", r.ID), zap.String("node_id", winner.NodeID), zap.Int("attempt", run.Attempt), zap.Bool("queued", run.Queued))
	if run.Queued {
		return cp.sendPrepare(ctx, run)
	}
	return cp.sendLaunch(ctx, run)
}

// startQueued launches a queued Run once it heads its node's queue and
// fits beside what runs there.
func (cp *ControlPlane) startQueued(ctx context.Context, r schemas.Run, fleet *placement.Fleet) error {
	n := fleet.Node(r.NodeID)
	if n == nil || !n.CanStart(r.ID) {
		return nil
	}
	run, err := cp.advance(ctx, r.ID, func(s *schemas.Run, emit func(schemas.RunEvent)) error {
		if !s.Queued || s.AttemptID != r.AttemptID || s.Phase.Terminal() {
			return bus.ErrNoChange
		}
		s.Queued = false
		emit(schemas.RunEvent{Type: schemas.EventNote, Phase: s.Phase, NodeID: s.NodeID, Attempt: s.Attempt, Message: "left the queue; launching"})
		return nil
	})
	if err != nil {
		return err
	}
	fleet.Start(r.NodeID, r.ID)
	return cp.sendLaunch(ctx, run)
}

// expireLeases marks nodes whose lease lapsed as lost and moves their Runs
// on: back to accepted for another attempt, or lost when attempts are spent.
// A node's lease is the later of its record's and the one its heartbeats
// earned in this replica's memory (cache.go); marking it lost is a CAS that
// also writes the lease this replica saw, so the record says when the node
// was last heard of.
func (cp *ControlPlane) expireLeases(ctx context.Context, now time.Time, active []*schemas.Run) bool {
	lost := map[string]bool{}
	for _, n := range cp.cache.nodeList() {
		if n.State == schemas.NodeLost {
			lost[n.NodeID] = true
		}
		if n.State == schemas.NodeLost || now.Before(n.LeaseExpires) {
			continue
		}
		rec, rev, err := bus.UpdateJSON(ctx, cp.nodesKV, n.NodeID, func(s *schemas.NodeRecord) error {
			lease := s.LeaseExpires
			if mem := cp.cache.memLeaseOf(s.NodeID, s.FencingToken); mem.After(lease) {
				lease = mem
			}
			if s.State == schemas.NodeLost || now.Before(lease) {
				return bus.ErrNoChange
			}
			s.State, s.LeaseExpires = schemas.NodeLost, lease
			return nil
		})
		if err != nil {
			if !errors.Is(err, bus.ErrNoChange) {
				cp.log.Warn("mark node lost", zap.String("node_id", n.NodeID), zap.Error(err))
			}
			continue
		}
		cp.cache.applyNodeRecord(rec, rev)
		lost[n.NodeID] = true
		cp.metrics.leaseLapses.Add(1)
		cp.log.Warn("node lease lapsed", zap.String("node_id", n.NodeID), zap.Time("lease_expired", n.LeaseExpires))
	}
	moved := false
	if len(lost) == 0 {
		return false
	}
	for _, r := range active {
		if r.NodeID == "" || r.Phase == schemas.PhaseAccepted || !lost[r.NodeID] {
			continue
		}
		_, err := cp.loseAttempt(ctx, *r, "node "+r.NodeID+" stopped heartbeating")
		switch {
		case err == nil:
			moved = true
		case !errors.Is(err, bus.ErrNoChange):
			cp.log.Warn("lose run attempt", zap.String("run_id", r.ID), zap.Error(err))
		}
	}
	if moved {
		cp.poke() // schedule the returned Runs elsewhere
	}
	return moved
}

// loseAttempt ends the Run's current attempt as lost: the Run goes back to
// accepted for another node, or ends lost when its attempts are spent (or
// cancelled, when a cancel was pending).
func (cp *ControlPlane) loseAttempt(ctx context.Context, r schemas.Run, why string) (schemas.Run, error) {
	return cp.advance(ctx, r.ID, func(s *schemas.Run, emit func(schemas.RunEvent)) error {
		if s.AttemptID != r.AttemptID || s.Phase.Terminal() || s.Phase == schemas.PhaseAccepted {
			return bus.ErrNoChange
		}
		from := s.Phase
		switch {
		case s.CancelRequested:
			s.Phase, s.Reason = schemas.PhaseCancelled, string(schemas.CodeNodeLost)
		case s.Attempt >= cp.cfg.MaxAttempts:
			s.Phase, s.Reason = schemas.PhaseLost, string(schemas.CodeAttemptsExhausted)
		default:
			s.Phase, s.Reason = schemas.PhaseAccepted, string(schemas.CodeNodeLost)
		}
		emit(phaseEvent(s, from, schemas.CodeNodeLost, why))
		if s.Phase == schemas.PhaseAccepted {
			s.NodeID = ""
			cp.poke()
		}
		return nil
	})
}

// askReconcile asks every live node for its full account. A control plane
// that just started may have missed reports while it was down; the answers
// (Reconciliation observations) square its Runs with what really runs.
func (cp *ControlPlane) askReconcile(ctx context.Context) {
	now := cp.now()
	for _, n := range cp.cache.nodeList() {
		if !n.Live(now) {
			continue
		}
		c := cp.command(n, "reconcile."+strconv.FormatInt(now.UnixNano(), 36), schemas.CmdReconcile)
		if err := cp.sendCommand(ctx, c); err != nil {
			cp.log.Warn("ask node to reconcile", zap.String("node_id", n.NodeID), zap.Error(err))
		}
	}
}
