package placement

import (
	"fmt"
	"math"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// MaxQueued is how many bookings may wait on a node behind the running ones.
const MaxQueued = 4

// Config weighs time against money and says how fast bytes move.
type Config struct {
	// PullBytesPerSecond is the assumed registry → node bandwidth.
	PullBytesPerSecond float64
	// CacheBytesPerSecond is how fast a missing cache is filled.
	CacheBytesPerSecond float64
	// ArtifactBytesPerSecond is the assumed artifact source → node
	// bandwidth.
	ArtifactBytesPerSecond float64
	// UnknownImageBytes is assumed for an image no node has reported.
	UnknownImageBytes int64
	// UnknownRuntime is how long a booking without max_runtime_seconds is
	// assumed to hold its place.
	UnknownRuntime time.Duration
	// SecondsPerDollarHour converts price into start-time seconds: a node
	// $1/hour dearer must start this many seconds sooner to win.
	SecondsPerDollarHour float64
	// FactsMaxAge is how old a node's facts may be before it is not
	// trusted with a booking.
	FactsMaxAge time.Duration
	// WholeNodeSeconds is added to the cost of starting a Run on a node
	// whose GPUs are all free when the Run needs fewer than all of them
	// and a partly used node could start it now: taking part of the last
	// whole nodes makes a later Run that needs a whole node wait for one
	// to drain. The partly used node wins unless the whole one starts the
	// Run this much sooner. Zero or less prices
	// nothing (controlplane.Config gives 0 the default: set it negative
	// there to turn this off).
	WholeNodeSeconds float64
	// FailedNodePenaltySeconds is added to the cost of a node an earlier
	// attempt of the Run failed on (Request.Penalties): the retry goes
	// elsewhere unless that node starts it this much sooner, and stays
	// eligible there (it may be the only node). Negative: no penalty
	// (controlplane.Config gives 0 the default).
	FailedNodePenaltySeconds float64
	// GPUHourPrice is what a GPU-hour costs, in USD: cards a Run holds,
	// or keeps free for itself, while its bytes arrive sit idle at this
	// price, which is
	// converted into cost seconds at SecondsPerDollarHour (see
	// idleGPURate). 0: DefaultGPUHourPrice; negative: idle cards cost
	// nothing.
	GPUHourPrice float64
}

// DefaultGPUHourPrice is the GPU-hour price (USD) placement assumes when
// its Config names none: about what an H100 rents for on demand.
const DefaultGPUHourPrice = 2.5

// DefaultConfig is what the control plane uses unless configured.
func DefaultConfig() Config {
	return Config{
		PullBytesPerSecond:     100e6,
		CacheBytesPerSecond:    200e6,
		ArtifactBytesPerSecond: 100e6,
		UnknownImageBytes:      1 << 30,
		UnknownRuntime:         10 * time.Minute,
		SecondsPerDollarHour:   60,
		FactsMaxAge:            2 * time.Minute,
		WholeNodeSeconds:       30,
		// Ten minutes: an attempt that failed on a node retries there only
		// when every other node is that much slower to start it.
		FailedNodePenaltySeconds: 600,
	}
}

// Request is one Run to place.
type Request struct {
	RunID   string
	Attempt int
	Run     schemas.RunRequest
	// Digest is the image's manifest digest (from Run.Image).
	Digest string
	// Artifacts are the Run's artifacts as intake resolved them
	// (schemas.Run.Artifacts): their sizes price a node that lacks them.
	Artifacts []schemas.ArtifactMount
	// Penalties are the nodes an earlier attempt of the Run failed on, by
	// node id, each with why ("attempt 1 failed here: oom_killed"): each
	// costs Config.FailedNodePenaltySeconds more.
	Penalties map[string]string
	// Spot is the Run's effective spot policy (schemas.Run.Spot): an
	// interruptible node takes the Run only when it allows spot, an
	// on-demand one only when it allows on-demand. Empty is never.
	Spot schemas.SpotPolicy
}

// Decide scores every node for req and returns the decision: the winner
// (lowest cost) and every other node with its reason.
func Decide(req Request, fleet *Fleet, now time.Time, cfg Config) schemas.BookingDecision {
	// Candidates are scored in place: returning and appending each one
	// copied 10k of them twice, most of a decision's time.
	d := schemas.BookingDecision{RunID: req.RunID, Attempt: req.Attempt, DecidedAt: now, Candidates: make([]schemas.Candidate, len(fleet.Nodes))}
	q := newQuery(req, fleet, now, cfg)
	s := q.scan(fleet, d.Candidates)
	r := s.rank(d.Candidates, &cfg, req.Run.Resources.GPUCount)
	best := r.best
	if best >= 0 && s.queued[best] && !r.freeFit {
		// Every node is busy, or takes the Run now only on cards a fetch
		// counts on: the best queue is weighed against waiting unbooked.
		best = r.queueOrWait(d.Candidates)
	}
	// Candidates stay in fleet order: sorting 10k of them would cost more
	// than scoring them. Readers (the CLI) sort for display.
	if best >= 0 {
		w := d.Candidates[best]
		d.Winner, d.WinnerQueued = w.NodeID, s.queued[best]
		n := fleet.Node(w.NodeID)
		d.FetchFirst = fetchesFirst(n, &w)
		if !d.WinnerQueued && !d.FetchFirst {
			d.GPUs, _, _ = n.PickGPUs(req.Run.Resources.GPUCount, req.Run.GPU)
		}
		for i := range d.Candidates {
			if c := &d.Candidates[i]; c.Eligible && i != best {
				c.Reason = schemas.ReasonOutscored // Cost beside the winner's says by how much
			}
		}
	}
	return d
}

// scan is what one pass over the fleet learned besides each node's
// Candidate: where the Run would wait in a queue, where it would take part
// of a node whose cards are all free, and whether a partly used node could
// start it now.
type scan struct {
	queued, whole  []bool
	partlyUsedFits bool
	// idleRate is the query's (idleGPURate).
	idleRate float64
}

// scan evaluates every node into its candidate.
func (q *query) scan(fleet *Fleet, cands []schemas.Candidate) scan {
	s := scan{queued: make([]bool, len(fleet.Nodes)), whole: make([]bool, len(fleet.Nodes)), idleRate: q.idleRate}
	gpus := q.req.Run.Resources.GPUCount
	for i, n := range fleet.Nodes {
		c := &cands[i]
		busy := q.evaluate(i, n, c)
		w := wholeNode(c, busy, n, gpus)
		s.queued[i], s.whole[i] = busy, w
		s.partlyUsedFits = s.partlyUsedFits || (c.Eligible && !busy && gpus > 0 && !w)
	}
	return s
}

// ranking is the best eligible candidate (-1: none), whether any eligible
// node takes the Run now on free cards (freeFit: not on cards a fetch
// counts on), and the two lowest costs of eligible nodes were they free
// now (soonest, second).
type ranking struct {
	best            int
	freeFit         bool
	soonest, second float64
	idleRate        float64
}

// rank adds the whole-node price where it applies and ranks the eligible
// candidates; gpus is how many cards the Run needs.
func (s *scan) rank(cands []schemas.Candidate, cfg *Config, gpus int64) ranking {
	r := ranking{best: -1, soonest: math.Inf(1), second: math.Inf(1), idleRate: s.idleRate}
	wholeDetail := ""
	for i := range cands {
		c := &cands[i]
		if !c.Eligible {
			continue
		}
		if s.whole[i] && s.partlyUsedFits && cfg.WholeNodeSeconds > 0 {
			// Only where a partly used node could start the Run now: were
			// every free node whole, the price would send it to a queue.
			if wholeDetail == "" {
				// One string for every such node: formatting one each
				// would cost a decision over 10k nodes thousands of
				// allocations.
				wholeDetail = fmt.Sprintf("all GPUs free: +%.0fs for breaking a whole node while a partly used one fits (the Run needs %d)",
					cfg.WholeNodeSeconds, gpus)
			}
			c.Cost += cfg.WholeNodeSeconds
			c.Detail = joinDetail(c.Detail, wholeDetail)
		}
		r.freeFit = r.freeFit || (!s.queued[i] && c.Components.DisplaceSeconds == 0)
		if r.best < 0 || better(c, &cands[r.best]) {
			r.best = i
		}
		if free := costIfFree(c, s.idleRate); free < r.soonest {
			r.soonest, r.second = free, r.soonest
		} else if free < r.second {
			r.second = free
		}
	}
	return r
}

// queueOrWait decides for a Run whose best node is a queue while no node
// takes it on free cards (each is busy, or only a fetch's cards are free
// there). A queued booking stays on its node, and a node with a queue
// starts nobody else, so the best queue is booked only when no other node
// could start the Run sooner even were it free now (queue estimates come
// from max runtimes: upper bounds). Otherwise the Run waits unbooked and
// takes the first node to free: queueOrWait then marks every eligible
// candidate at capacity and returns -1; else it returns the best.
func (r ranking) queueOrWait(cands []schemas.Candidate) int {
	w := &cands[r.best]
	other := r.soonest
	if costIfFree(w, r.idleRate) == r.soonest {
		other = r.second
	}
	if w.Cost <= other {
		return r.best
	}
	for i := range cands {
		if c := &cands[i]; c.Eligible {
			c.Eligible, c.Reason = false, schemas.ReasonAtCapacity
			c.Detail = joinDetail(c.Detail, fmt.Sprintf("busy: the Run would start here in about %.0fs; every node is busy and one could start it in %.0fs were it free, so it waits for the first to free rather than in one node's queue", c.Components.StartSeconds, other))
		}
	}
	return -1
}

// wholeNode reports whether the Run, needing gpus but fewer than the
// node has, fits now on node n whose GPUs are all free.
func wholeNode(c *schemas.Candidate, busy bool, n *Node, gpus int64) bool {
	all := n.Record.Capacity.GPUCount
	return c.Eligible && !busy && gpus > 0 && gpus < all && c.Free.GPUCount == all
}

// better reports whether candidate a beats b: the lower cost, then the
// fewer free GPUs left (the fuller node: among equal costs, filling it
// leaves the roomier nodes free for a later, larger or warm-elsewhere
// Run), then the lower id. Candidates are read through pointers: copying
// two of them per node cost more than comparing them.
func better(a, b *schemas.Candidate) bool {
	if a.Cost != b.Cost {
		return a.Cost < b.Cost
	}
	if a.Free.GPUCount != b.Free.GPUCount {
		return a.Free.GPUCount < b.Free.GPUCount
	}
	return a.NodeID < b.NodeID
}

// costIfFree is c's cost were its node free now: its fetches, with the
// cards idle through all of them (idleRate, the query's idleGPURate), and
// its price, no queue.
func costIfFree(c *schemas.Candidate, idleRate float64) float64 {
	k := &c.Components
	fetching := k.PullSeconds + k.CacheSeconds + k.ArtifactSeconds + k.LinkBusySeconds
	return c.Cost - k.StartSeconds - k.IdleGPUSeconds - k.DisplaceSeconds + fetching + idleRate*fetching
}

// joinDetail appends detail b to a candidate's detail a.
func joinDetail(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// ReadyAt is when d's Run should have its bytes on the winner, booked at
// now: the winner's link free, then its pull and artifact fetch (zero
// when it fetches nothing there).
func ReadyAt(d schemas.BookingDecision, now time.Time) time.Time {
	for _, c := range d.Candidates {
		if k := c.Components; c.NodeID == d.Winner && k.FetchesBytes() {
			return now.Add(time.Duration((k.LinkBusySeconds + k.PullSeconds + k.ArtifactSeconds) * float64(time.Second)))
		}
	}
	return time.Time{}
}

// Hold is how long a booking of req is expected to hold its place: its
// max_runtime_seconds, else unknown (Config.UnknownRuntime).
func Hold(req schemas.RunRequest, unknown time.Duration) time.Duration {
	if req.MaxRuntimeSeconds > 0 {
		return time.Duration(req.MaxRuntimeSeconds) * time.Second
	}
	return unknown
}
