package scheduler

import (
	"cmp"
	"slices"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/controlplane/queue"
	"github.com/warmfleet/warmfleet/schemas"
)

// sessionHold is how long placement assumes a resident session keeps what
// it holds: sessions have no max runtime, so a Run queues behind one only
// when no node could start it sooner.
const sessionHold = 24 * time.Hour

// Fleet is the fleet as placement sees it now, for parts that book outside
// a pass (session attach).
func (s *Scheduler) Fleet(now time.Time) *placement.Fleet {
	return s.snapshot(s.cache.ActiveRuns(), now)
}

// snapshot builds the fleet as placement sees it: every node with what is
// booked on it, running Runs and resident sessions (one ledger: they hold
// CPU, memory and cards alike), then queued Runs in booking order.
// Indexing is placement.NewFleet's job; this only groups bookings by node.
func (s *Scheduler) snapshot(runs []*schemas.Run, now time.Time) *placement.Fleet {
	booked := map[string][]*schemas.Run{}
	for _, r := range runs {
		if r.NodeID != "" && !r.Phase.Terminal() && r.Phase != schemas.PhaseAccepted {
			booked[r.NodeID] = append(booked[r.NodeID], r)
		}
	}
	sessions := map[string][]placement.Booking{}
	for _, o := range s.cache.Residencies() {
		sessions[o.Host] = append(sessions[o.Host], placement.Booking{
			RunID:     "session " + o.Key().String(),
			Resources: schemas.Resources{CPUMillis: o.CPUMillis, MemoryBytes: o.MemoryBytes, GPUCount: int64(len(o.GPUs))},
			GPUs:      o.GPUs, ExpectedEnd: now.Add(sessionHold),
		})
	}
	recs := s.cache.Nodes()
	nodes := make([]*placement.Node, 0, len(recs))
	for _, rec := range recs {
		n := placement.NewNode(rec)
		n.Running = append(n.Running, sessions[rec.NodeID]...)
		rs := booked[rec.NodeID]
		slices.SortFunc(rs, func(a, b *schemas.Run) int { return cmp.Compare(a.PhaseSince.UnixNano(), b.PhaseSince.UnixNano()) })
		for _, r := range rs {
			if b := s.booking(r, now); r.Queued {
				n.Queued = append(n.Queued, b)
			} else {
				n.Running = append(n.Running, b)
			}
		}
		nodes = append(nodes, n)
	}
	return placement.NewFleet(nodes)
}

// booking is what booked Run r holds on its node, as placement sees it:
// its resources and cards until it should free its place (its start plus
// its max runtime, or placement's UnknownRuntime when it has none; a
// queued Run has not started, so its start is now).
func (s *Scheduler) booking(r *schemas.Run, now time.Time) placement.Booking {
	start := r.PhaseSince
	if r.StartedAt != nil {
		start = *r.StartedAt
	}
	if r.Queued || start.IsZero() {
		start = now
	}
	b := placement.Booking{RunID: r.ID, Resources: r.Request.Resources, ExpectedEnd: start.Add(placement.Hold(r.Request, s.cfg.Placement.UnknownRuntime)), GPUs: r.GPUs, Want: r.Request.GPU,
		Fetching: lifecycle.Fetching(*r)}
	if r.ReadyBy != nil {
		b.ReadyAt = *r.ReadyBy
	}
	return b
}

// intakeViewMaxAge bounds how old the fleet intake decides on may be.
const intakeViewMaxAge = 250 * time.Millisecond

// intakeView is a fleet snapshot taken for intake from the cache (nodes,
// and the bookings of every active Run). Nothing books on it, so intake
// workers share it.
type intakeView struct {
	fleet   *placement.Fleet
	at      time.Time
	nodeVer uint64 // cache.nodeVersion when it was taken
}

// intakeFleet returns a view younger than intakeViewMaxAge of the nodes as
// they are now, taking a new one when needed (one worker takes it; the
// others wait for it rather than take their own).
func (s *Scheduler) intakeFleet(now time.Time) *intakeView {
	current := func() *intakeView {
		v := s.intakeView.Load()
		if v == nil || now.Sub(v.at) > intakeViewMaxAge || v.nodeVer != s.cache.NodeVersion() {
			return nil
		}
		return v
	}
	if v := current(); v != nil {
		return v
	}
	s.intakeViewMu.Lock()
	defer s.intakeViewMu.Unlock()
	if v := current(); v != nil {
		return v
	}
	v := &intakeView{at: now, nodeVer: s.cache.NodeVersion()}
	v.fleet = s.snapshot(s.cache.ActiveRuns(), now)
	s.intakeView.Store(v)
	return v
}

// AtIntake is intake's early decision for a new Run, made in the write
// that creates it, when that decision can only be "no node fits now;
// waiting": the scheduler would otherwise write the Run and publish an
// event again for the same answer a moment later. Anything that could
// book, rent or fail the Run is left to the scheduler (nil), so intake
// never books a node. The fleet may lag the cache by intakeViewMaxAge: a
// Run may be told to wait for a place that freed meanwhile, and the next
// pass, which decides every Run it has not decided itself, places it.
func (s *Scheduler) AtIntake(r schemas.Run) lifecycle.Transition {
	pol := s.policy()
	if s.renter != nil || !plainPolicy(pol) {
		return nil
	}
	now := s.cfg.Now()
	v := s.intakeFleet(now)
	if v.fleet.MayWin(r.Request.Resources, now) {
		return nil // placement's to decide; intake only records the certain "no"
	}
	d, err := s.decide(&r, v.fleet, pol, now)
	if err != nil || d.Winner != "" || (!s.cfg.WaitForCapacity && queue.Unsatisfiable(d)) {
		return nil
	}
	s.stats.DecidedAtIntake.Add(1)
	return lifecycle.NoNodeFits(d, "")
}

// plainPolicy reports whether pol treats every Run alike: no classes (none
// preempts), no quotas, no budgets. Otherwise a Run no node fits may still
// wait on a quota or a budget, or preempt, which only a pass can tell.
func plainPolicy(pol *policy.Snapshot) bool {
	if len(pol.PriorityClasses) > 0 || pol.Default.Quota != nil || pol.Default.Budget != nil {
		return false
	}
	for _, t := range pol.Tenants {
		if t.Quota != nil || t.Budget != nil {
			return false
		}
	}
	return true
}
