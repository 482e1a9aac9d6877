package queue

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// victimSet is one node's way to make room for a preemptor.
type victimSet struct {
	node           string
	victims        []Victim
	gpuSec, cpuSec float64
	// stopping are the Runs already stopping there that it waits for.
	stopping []string
	// queueFirst: the set makes room for the preemptor but not for the
	// node's queue too, which takes it first; any other set is better.
	queueFirst bool
}

func (a *victimSet) less(b *victimSet) bool {
	if a.queueFirst != b.queueFirst {
		return b.queueFirst
	}
	return cmp.Or(cmp.Compare(a.gpuSec, b.gpuSec), cmp.Compare(a.cpuSec, b.cpuSec), cmp.Compare(a.node, b.node)) < 0
}

// preempt looks, on every node d found only busy, for the victims whose
// stopping makes r fit, and takes the set losing the fewest GPU-seconds.
// r may stop other Runs only when its class preempts or its tenant
// reclaims quota it lent. Runs already stopping count as gone: a node
// where they make room needs no new victim, and r waits for them. It
// reports whether r preempts (or waits on a preemption); false leaves r
// to wait as decided.
func (p *planner) preempt(t *tenantState, r *schemas.Run, cls schemas.PriorityClass, d schemas.BookingDecision) bool {
	reclaim := withinNominal(t, r.Request.Resources, requestModel(r))
	if !cls.Preempts && !reclaim {
		return false
	}
	// Within a pass victims only go and claims only grow, so a search
	// that found nothing finds nothing again for a Run alike (one with a
	// claim of its own to give up excepted).
	alike := searchKey{shape: ShapeOf(r.Request), value: cls.Value, preempts: cls.Preempts}
	if reclaim {
		alike.reclaimFor = t.name
	}
	if _, claimed := claimedNode(r); !claimed && p.fruitless[alike] {
		return false
	}
	var best *victimSet
	for _, c := range d.Candidates {
		if !c.Eligible && c.Reason != schemas.ReasonAtCapacity && c.Reason != schemas.ReasonQueueFull {
			continue
		}
		// A node whose cards put t over quota would only make r wait on
		// the quota once its victims are gone.
		n := p.in.Fleet.Node(c.NodeID)
		if n == nil || p.quotaExcess(t, r.Request.Resources, NodeGPUModel(n.Record)) != nil {
			continue
		}
		if s := p.victimsOn(t, r, cls, reclaim, n); s != nil && (best == nil || s.less(best)) {
			best = s
		}
	}
	if best == nil {
		p.fruitless[alike] = true
		return false
	}
	p.claims[best.node] = append(p.claims[best.node], claim{r.ID, r.Request.Resources, cls.Value})
	// Its place is as good as held: the tenant's next preemptor must
	// fit its quota beside it.
	t.hold(r.Request.Resources, NodeGPUModel(p.in.Fleet.Node(best.node).Record), 1)
	d.Winner, d.WinnerQueued, d.GPUs = "", false, nil
	if len(best.victims) == 0 {
		p.wait(r, schemas.CodePreempting, preemptingOn+best.node+": waiting for "+strings.Join(best.stopping, ","),
			"waits for "+strings.Join(best.stopping, ", ")+" to stop on "+best.node, &d)
		return true
	}
	names := make([]string, len(best.victims))
	for i, v := range best.victims {
		p.free(v.Run)
		d.Victims = append(d.Victims, v.Victim)
		names[i] = fmt.Sprintf("%s (%s, %.0f GPU-seconds)", v.RunID, v.Why, v.GPUSeconds)
	}
	ids := make([]string, len(best.victims))
	for i, v := range best.victims {
		ids[i] = v.RunID
	}
	p.res.Actions = append(p.res.Actions, Action{Kind: KindPreempt, Run: r, Decision: d, Code: schemas.CodePreempting, Victims: best.victims,
		Summary: preemptingOn + best.node + ": " + strings.Join(ids, ","),
		Message: fmt.Sprintf("preempting %d Run(s) on %s to make room: %s", len(ids), best.node, strings.Join(names, ", "))})
	return true
}

// victimsOn is the fewest GPU-seconds of eligible Runs on n whose stopping
// makes r fit there, or nil when none does. Room is made for n's queue
// too, which starts first; where that cannot be, room for r alone: the
// queue's head then takes it, r preempts again (the head, just started,
// loses least) and the queue drains toward r.
func (p *planner) victimsOn(t *tenantState, r *schemas.Run, cls schemas.PriorityClass, reclaim bool, n *placement.Node) *victimSet {
	var stopping []string
	var cands []Victim
	for _, b := range p.byNode[n.Record.NodeID] {
		switch {
		case b.Queued:
		case p.freed[b.ID]:
			stopping = append(stopping, b.ID)
		default:
			if why := p.why(t, cls, reclaim, b); why != "" {
				cands = append(cands, p.victim(b, why))
			}
		}
	}
	slices.SortFunc(cands, func(a, b Victim) int {
		return cmp.Or(cmp.Compare(a.GPUSeconds, b.GPUSeconds), cmp.Compare(cpuSeconds(a, p.in.Now), cpuSeconds(b, p.in.Now)),
			heldSince(b.Run).Compare(heldSince(a.Run)))
	})
	s := p.cheapest(n, r, stopping, cands, true)
	if s == nil && len(n.Queued) > 0 {
		if s = p.cheapest(n, r, stopping, cands, false); s != nil {
			s.queueFirst = true
		}
	}
	return s
}

// cheapest takes victims from cands (cheapest first) until r fits on n
// beside the Runs that stay (and n's queue, withQueue), then drops those
// the rest make room without; nil when r never fits. With no victim
// needed, it is the Runs already stopping that make room, or nil when
// none do (placement had its reasons not to place r there).
func (p *planner) cheapest(n *placement.Node, r *schemas.Run, stopping []string, cands []Victim, withQueue bool) *victimSet {
	s := &victimSet{node: n.Record.NodeID, stopping: stopping}
	gone := map[string]bool{}
	for _, id := range stopping {
		gone[id] = true
	}
	fits := p.fitsAfter(n, r, gone, withQueue)
	if fits && len(stopping) == 0 {
		return nil
	}
	taken := map[string]*usage{} // by tenant: what its victims here hold
	for i := 0; !fits && i < len(cands); i++ {
		c := cands[i]
		if c.Why == "reclaim" {
			// Reclaim takes no more than a borrower borrows.
			u := taken[c.Tenant]
			if u == nil {
				u = &usage{}
				taken[c.Tenant] = u
			}
			if !overNominal(p.tenant(c.Tenant), u) {
				continue
			}
			u.add(c.Run.Request.Resources, NodeGPUModel(n.Record), 1)
		}
		gone[c.RunID], s.victims = true, append(s.victims, c)
		fits = p.fitsAfter(n, r, gone, withQueue)
	}
	if !fits {
		return nil
	}
	for i := len(s.victims) - 1; i >= 0; i-- {
		id := s.victims[i].RunID
		if delete(gone, id); p.fitsAfter(n, r, gone, withQueue) {
			s.victims = slices.Delete(s.victims, i, i+1)
		} else {
			gone[id] = true
		}
	}
	for _, v := range s.victims {
		s.gpuSec += v.GPUSeconds
		s.cpuSec += cpuSeconds(v, p.in.Now)
	}
	return s
}

// why is why booked Run b may be stopped for a preemptor of t of class
// cls: "priority" (a strictly lower class), "reclaim" (a borrower of t's
// cohort, when t reclaims), or "" (it may not be).
func (p *planner) why(t *tenantState, cls schemas.PriorityClass, reclaim bool, b *schemas.Run) string {
	if !b.Request.Preemptible || b.CancelRequested || b.Phase.Terminal() || b.Phase == schemas.PhaseAccepted {
		return ""
	}
	if cls.Preempts && p.class(b).Value < cls.Value {
		return "priority"
	}
	if bt := p.tenant(b.TenantOf()); reclaim && bt != t && bt.pol.Cohort == t.pol.Cohort && overNominal(bt, nil) {
		return "reclaim"
	}
	return ""
}

func (p *planner) victim(b *schemas.Run, why string) Victim {
	cards := int64(len(b.GPUs))
	if cards == 0 {
		cards = b.Request.Resources.GPUCount
	}
	return Victim{Run: b, Victim: schemas.Victim{RunID: b.ID, Tenant: b.TenantOf(), NodeID: b.NodeID, Priority: b.Request.Priority,
		GPUSeconds: float64(cards) * p.in.Now.Sub(heldSince(b)).Seconds(), Why: why}}
}

// heldSince is when b began to hold its place.
func heldSince(b *schemas.Run) time.Time {
	if n := len(b.Attempts); n > 0 && b.Attempts[n-1].Attempt == b.Attempt && b.Attempts[n-1].HeldFrom != nil {
		return *b.Attempts[n-1].HeldFrom // the current attempt's; StartedAt may be an earlier attempt's
	}
	return b.PhaseSince
}

// cpuSeconds is the CPU-millisecond-seconds v loses: the tie-break among
// victims without cards.
func cpuSeconds(v Victim, now time.Time) float64 {
	return float64(v.Run.Request.Resources.CPUMillis) * now.Sub(heldSince(v.Run)).Seconds()
}

// fitsAfter reports whether r fits on n once the Runs in gone stop,
// beside what stays, the places other preemptors claimed there, and
// (withQueue) the node's queue, which starts first.
func (p *planner) fitsAfter(n *placement.Node, r *schemas.Run, gone map[string]bool, withQueue bool) bool {
	free, running := n.Record.Capacity, make([]placement.Booking, 0, len(n.Running))
	for _, b := range n.Running {
		if !gone[b.RunID] {
			free, running = free.Sub(b.Resources), append(running, b)
		}
	}
	need, count := r.Request.Resources, len(running)+1
	for _, c := range p.claims[n.Record.NodeID] {
		if p.holds(c, r) {
			need, count = need.Add(c.res), count+1
		}
	}
	for i := 0; withQueue && i < len(n.Queued); i++ {
		need, count = need.Add(n.Queued[i].Resources), count+1
	}
	if !need.Fits(free) {
		return false
	}
	if slots := n.MaxWorkloads(); slots > 0 && count > slots {
		return false
	}
	view := *n
	view.Running = running
	_, _, ok := view.PickGPUs(need.GPUCount, r.Request.GPU)
	return ok
}

// claim is a place a preemptor waits for. It holds the place against
// Runs of its class value and below; a higher class may take it.
type claim struct {
	runID string
	res   schemas.Resources
	value int
}

// holds reports whether c holds its place against r.
func (p *planner) holds(c claim, r *schemas.Run) bool {
	return c.runID != r.ID && c.value >= p.class(r).Value
}

// preemptingOn begins the wait summary of a preemptor, naming its node.
const preemptingOn = "preempting on "

// claimedNode is the node r's recorded wait says it preempts on: a
// preemptor the re-decision rule skips keeps its place that way.
func claimedNode(r *schemas.Run) (string, bool) {
	rest, ok := strings.CutPrefix(r.Waiting, preemptingOn)
	if !ok {
		return "", false
	}
	node, _, ok := strings.Cut(rest, ":")
	return node, ok
}

// unclaim drops runID's claims: it is searching again.
func (p *planner) unclaim(runID string) {
	for node, cs := range p.claims {
		p.claims[node] = slices.DeleteFunc(cs, func(c claim) bool { return c.runID == runID })
	}
}

// searchKey is what a victim search depends on besides the fleet: the
// Run's shape, its class, and the tenant it reclaims for, if any.
type searchKey struct {
	shape      Shape
	value      int
	preempts   bool
	reclaimFor string
}
