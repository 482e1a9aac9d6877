package placement

import (
	"slices"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// A node's queue holds bookings waiting for room and bookings fetching
// their bytes there first (Booking.Fetching): these claim cards only once
// the bytes are there, so they neither head the queue nor keep a Run that
// can start now off the free cards, though taking cards they count on is
// priced (Components.DisplaceSeconds).

// queueFor works out whether the Run starts on the node now (fitsNow)
// or, behind what runs and waits there, in about queue seconds; ok is
// false when the node's queue is full; inQueue is that queue by readiness.
// A booking still fetching its bytes holds no cards until they are there.
// A Run that would fetch first too (first) counts them as taken, so that
// fetches never book one node's cards twice over; one that can start now
// may take them, at the price of the wait it would cause
// (Components.DisplaceSeconds).
func (q *query) queueFor(n *Node, inQueue queuedState, free schemas.Resources, usable int64, first bool, c *schemas.Candidate) (queue float64, fitsNow, ok bool) {
	fitsNow = inQueue.ready == 0 && q.fits(n, free, usable, schemas.Resources{}, 0)
	if fitsNow && inQueue.fetchingCount > 0 && !q.fits(n, free, usable, inQueue.fetching, inQueue.fetchingCount) {
		if first {
			fitsNow = false
		} else {
			c.Components.DisplaceSeconds = Hold(q.req.Run, q.cfg.UnknownRuntime).Seconds()
		}
	}
	if fitsNow {
		return 0, true, true
	}
	if len(n.Queued) >= MaxQueued {
		return 0, false, reject(c, schemas.ReasonQueueFull, "%d bookings already wait on this node", len(n.Queued))
	}
	return waitSeconds(n, q.req.Run.Resources, q.now, &q.cfg), false, true
}

// fits reports whether the Run fits on n now beside what runs there (free
// is what that leaves) and beside count more bookings needing also.
func (q *query) fits(n *Node, free schemas.Resources, usable int64, also schemas.Resources, count int) bool {
	need := q.req.Run.Resources
	if slots := n.MaxWorkloads(); !need.Add(also).Fits(free) || (slots > 0 && len(n.Running)+count >= slots) {
		return false
	}
	want := need.GPUCount + also.GPUCount
	return need.GPUCount == 0 || n.freeCount(q.req.Run.GPU, q.model, want, usable) == want
}

// waitSeconds estimates when enough running bookings end for need to fit
// behind whatever is already queued on the node (queued bookings start
// first, in order).
func waitSeconds(n *Node, need schemas.Resources, now time.Time, cfg *Config) float64 {
	// A node runs a few bookings: sorting a copy on the stack spares an
	// allocation per busy node.
	var buf [8]Booking
	running := append(buf[:0], n.Running...)
	for i, b := range running {
		if !b.ExpectedEnd.After(now) {
			// Past its expected end yet still booked (a long fetch, or
			// no max runtime): it is assumed to hold its place as long
			// again as a booking without one.
			running[i].ExpectedEnd = now.Add(cfg.UnknownRuntime)
		}
	}
	slices.SortFunc(running, func(a, b Booking) int { return a.ExpectedEnd.Compare(b.ExpectedEnd) })
	free := n.Record.Capacity
	for _, b := range running {
		free = free.Sub(b.Resources)
	}
	want := need
	for _, q := range n.Queued {
		want = want.Add(q.Resources)
	}
	slots, active := n.MaxWorkloads(), len(running)+len(n.Queued)
	at := now
	for i := 0; !want.Fits(free) || (slots > 0 && active >= slots); i++ {
		if i == len(running) {
			// Even an empty node cannot hold the queue and this Run at
			// once: the queue must run first.
			return at.Sub(now).Seconds() + cfg.UnknownRuntime.Seconds()
		}
		free, active = free.Add(running[i].Resources), active-1
		if running[i].ExpectedEnd.After(at) {
			at = running[i].ExpectedEnd
		}
	}
	return at.Sub(now).Seconds()
}

// queuedState is a node's queue by readiness: how many bookings have their
// bytes there (ready), and what the others, still fetching, will claim.
type queuedState struct {
	ready, fetchingCount int
	fetching             schemas.Resources
}

// queuedByReadiness sums the node's queue by readiness.
func (n *Node) queuedByReadiness() queuedState {
	var s queuedState
	for _, b := range n.Queued {
		if b.Fetching {
			s.fetching, s.fetchingCount = s.fetching.Add(b.Resources), s.fetchingCount+1
		} else {
			s.ready++
		}
	}
	return s
}

// linkBusy is how long the node's link stays busy with the bytes its
// fetching bookings still expect, from now.
func (n *Node) linkBusy(now time.Time) float64 {
	var until time.Time
	for _, list := range [][]Booking{n.Running, n.Queued} {
		for _, b := range list {
			if b.Fetching && b.ReadyAt.After(until) {
				until = b.ReadyAt
			}
		}
	}
	return max(0, until.Sub(now).Seconds())
}

// CanStart reports whether the first queued booking on the node whose bytes
// are there, which must be runID, fits beside what runs now and what the
// bookings ahead of it, still fetching theirs, will claim. Those are
// passed over: each claims its cards once its bytes are there, in turn.
func (n *Node) CanStart(runID string) bool {
	head := slices.IndexFunc(n.Queued, func(b Booking) bool { return !b.Fetching })
	if head < 0 || n.Queued[head].RunID != runID {
		return false
	}
	free, active := n.Record.Capacity, len(n.Running)+head
	for _, b := range n.Running {
		free = free.Sub(b.Resources)
	}
	need := n.Queued[head].Resources
	for _, b := range n.Queued[:head] {
		need = need.Add(b.Resources)
	}
	if slots := n.MaxWorkloads(); !need.Fits(free) || (slots > 0 && active >= slots) {
		return false
	}
	_, _, ok := n.PickGPUs(need.GPUCount, n.Queued[head].Want)
	return ok
}
