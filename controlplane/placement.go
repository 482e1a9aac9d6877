package controlplane

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// snapshot builds the fleet as placement sees it: every node with the Runs
// booked on it, running ones and queued ones in booking order. Indexing is
// placement.NewFleet's job; this only groups bookings by node.
func (cp *ControlPlane) snapshot(runs []*schemas.Run, now time.Time) *placement.Fleet {
	booked := map[string][]*schemas.Run{}
	for _, r := range runs {
		if r.NodeID != "" && !r.Phase.Terminal() && r.Phase != schemas.PhaseAccepted {
			booked[r.NodeID] = append(booked[r.NodeID], r)
		}
	}
	recs := cp.cache.nodeList()
	nodes := make([]*placement.Node, 0, len(recs))
	for _, rec := range recs {
		n := placement.NewNode(rec)
		rs := booked[rec.NodeID]
		slices.SortFunc(rs, func(a, b *schemas.Run) int { return cmp.Compare(a.PhaseSince.UnixNano(), b.PhaseSince.UnixNano()) })
		for _, r := range rs {
			b := placement.Booking{RunID: r.ID, Resources: r.Request.Resources, ExpectedEnd: cp.expectedEnd(*r, now)}
			if r.Queued {
				n.Queued = append(n.Queued, b)
			} else {
				n.Running = append(n.Running, b)
			}
		}
		nodes = append(nodes, n)
	}
	return placement.NewFleet(nodes)
}

// expectedEnd is when a booking should free its place.
func (cp *ControlPlane) expectedEnd(r schemas.Run, now time.Time) time.Time {
	start := r.PhaseSince
	if r.StartedAt != nil {
		start = *r.StartedAt
	}
	if r.Queued || start.IsZero() {
		start = now
	}
	if r.Request.MaxRuntimeSeconds > 0 {
		return start.Add(time.Duration(r.Request.MaxRuntimeSeconds) * time.Second)
	}
	return start.Add(cp.cfg.Placement.UnknownRuntime)
}

// permanent reports whether a rejection holds whatever the node's current
// load: the node can never run this request as it is.
func permanent(code schemas.Code) bool {
	switch code {
	case schemas.ReasonInsufficientCPU, schemas.ReasonInsufficientMemory, schemas.ReasonInsufficientGPU,
		schemas.ReasonInsufficientDisk, schemas.ReasonGPUModelMismatch, schemas.ReasonDriverMissing,
		schemas.ReasonDriverTooOld, schemas.ReasonPlatformMismatch:
		return true
	}
	return false
}

// unsatisfiable reports whether every node rejects the Run for a reason
// that waiting will not change.
func unsatisfiable(d schemas.BookingDecision) bool {
	if len(d.Candidates) == 0 {
		return false // no nodes yet: one may enroll
	}
	for _, c := range d.Candidates {
		if c.Eligible || !permanent(c.Reason) {
			return false
		}
	}
	return true
}

// waitingSummary condenses an unwinnable decision so an unchanged one is not
// recorded again on every scheduling pass: the nodes by name while there
// are few, else the count of each reason (a per-node list over thousands
// of nodes would make every waiting Run's record huge).
func waitingSummary(d schemas.BookingDecision) string {
	if len(d.Candidates) == 0 {
		return "no nodes enrolled"
	}
	if len(d.Candidates) <= maxNamedInSummary {
		s := ""
		for _, c := range d.Candidates {
			s += c.NodeID + "=" + string(c.Reason) + ";"
		}
		return s
	}
	counts := map[schemas.Code]int{}
	for _, c := range d.Candidates {
		counts[c.Reason]++
	}
	reasons := slices.SortedFunc(maps.Keys(counts), func(a, b schemas.Code) int {
		return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b))
	})
	s := strconv.Itoa(len(d.Candidates)) + " nodes:"
	for _, r := range reasons {
		s += " " + string(r) + "=" + strconv.Itoa(counts[r])
	}
	return s
}

// maxNamedInSummary is the largest fleet whose waiting summary names nodes.
const maxNamedInSummary = 16

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
func (cp *ControlPlane) intakeFleet(now time.Time) *intakeView {
	current := func() *intakeView {
		v := cp.fleetView.Load()
		if v == nil || now.Sub(v.at) > intakeViewMaxAge || v.nodeVer != cp.cache.nodeVersion() {
			return nil
		}
		return v
	}
	if v := current(); v != nil {
		return v
	}
	cp.fleetViewMu.Lock()
	defer cp.fleetViewMu.Unlock()
	if v := current(); v != nil {
		return v
	}
	v := &intakeView{at: now, nodeVer: cp.cache.nodeVersion()}
	v.fleet = cp.snapshot(cp.cache.activeRuns(), now)
	cp.fleetView.Store(v)
	return v
}

// decideAtIntake records a new Run's first decision in the write that
// creates it, when that decision can only be "no node fits now; waiting":
// the scheduler would otherwise write the Run and publish an event again
// for the same answer a moment later. Anything that could book, rent or
// fail the Run is left to the scheduler, so intake never books a node.
// The fleet may lag the cache by intakeViewMaxAge: a Run may be told to
// wait for a place that freed meanwhile, and the scheduler's next pass,
// which decides every Run it has not decided itself, places it.
func (cp *ControlPlane) decideAtIntake(r *schemas.Run, emit func(schemas.RunEvent)) {
	if cp.cfg.Capacity != nil {
		return
	}
	now := cp.now()
	v := cp.intakeFleet(now)
	if v.fleet.MayWin(r.Request.Resources, now) {
		return // placement's to decide; intake only records the certain "no"
	}
	d, err := cp.decide(r, v.fleet, now)
	if err != nil || d.Winner != "" || (!cp.cfg.WaitForCapacity && unsatisfiable(d)) {
		return
	}
	cp.metrics.intakeDecided.Add(1)
	r.Waiting = waitingSummary(d)
	emit(schemas.RunEvent{Type: schemas.EventDecided, Phase: r.Phase, Code: schemas.CodeNoCapacity, Message: msgNoNodeFits, Decision: &d})
}

// msgNoNodeFits is the message of a decision that leaves a Run waiting.
const msgNoNodeFits = "no node fits now; waiting"

// decide makes one placement decision for r's next attempt over fleet,
// and counts it (and a miss, when no node wins).
func (cp *ControlPlane) decide(r *schemas.Run, fleet *placement.Fleet, now time.Time) (schemas.BookingDecision, error) {
	ref, err := schemas.ParseImageRef("image", r.Request.Image)
	if err != nil {
		return schemas.BookingDecision{}, err
	}
	start := time.Now()
	d := placement.Decide(placement.Request{RunID: r.ID, Attempt: r.Attempt + 1, Run: r.Request, Digest: ref.Digest}, fleet, now, cp.cfg.Placement)
	cp.metrics.decisionNanos.Add(time.Since(start).Nanoseconds())
	cp.metrics.decisions.Add(1)
	if d.Winner == "" {
		cp.metrics.placementMiss.Add(1)
	}
	return d, nil
}
