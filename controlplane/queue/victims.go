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

func secondsOf(s int64) time.Duration { return time.Duration(s) * time.Second }

// mayPreempt reports whether r may stop other Runs at all: its class
// preempts, or its tenant reclaims quota it lent.
func (p *planner) mayPreempt(t *tenantState, r *schemas.Run, cls schemas.PriorityClass) bool {
	return cls.Preempts || withinNominal(t, r.Request.Resources, requestModel(r))
}

// victimSet is one node's way to make room for a preemptor.
type victimSet struct {
	node           string
	victims        []Victim
	gpuSec, cpuSec float64
	// stopping are the Runs already stopping there that it waits for.
	stopping []string
}

func (a *victimSet) less(b *victimSet) bool {
	return cmp.Or(cmp.Compare(a.gpuSec, b.gpuSec), cmp.Compare(a.cpuSec, b.cpuSec), cmp.Compare(a.node, b.node)) < 0
}

// preempt looks, on every node d found only busy, for the victims whose
// stopping makes r fit, and takes the set losing the fewest GPU-seconds.
// Runs already stopping count as gone: a node where they make room needs
// no new victim, and r waits for them. It reports whether r preempts (or
// waits on a preemption); false leaves r to wait as decided.
func (p *planner) preempt(t *tenantState, r *schemas.Run, cls schemas.PriorityClass, d schemas.BookingDecision) bool {
	reclaim := withinNominal(t, r.Request.Resources, requestModel(r))
	// Within a pass victims only go and claims only grow, so a search
	// that found nothing finds nothing again for a Run alike (one with a
	// claim of its own to give up excepted).
	alike := searchKey{shape: ShapeOf(r.Request), value: cls.Value, preempts: cls.Preempts}
	if reclaim {
		alike.reclaimFor = t.name
	}
	if _, claimed := claimedNode(r); !claimed {
		if p.fruitless[alike] {
			return false
		}
	}
	p.unclaim(r.ID)
	var best *victimSet
	for _, c := range d.Candidates {
		if !c.Eligible && c.Reason != schemas.ReasonAtCapacity && c.Reason != schemas.ReasonQueueFull {
			continue
		}
		n := p.in.Fleet.Node(c.NodeID)
		if n == nil {
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
	p.claims[best.node] = append(p.claims[best.node], claim{r.ID, r.Request.Resources})
	d.Winner, d.WinnerQueued, d.GPUs = "", false, nil
	if len(best.victims) == 0 {
		p.wait(r, schemas.CodePreempting, preemptingOn+best.node+": waiting for "+strings.Join(best.stopping, ","),
			"waits for "+strings.Join(best.stopping, ", ")+" to stop on "+best.node, &d)
		return true
	}
	names := make([]string, len(best.victims))
	for i, v := range best.victims {
		p.freed[v.RunID] = true
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
// makes r fit there, or nil when none does.
func (p *planner) victimsOn(t *tenantState, r *schemas.Run, cls schemas.PriorityClass, reclaim bool, n *placement.Node) *victimSet {
	s := &victimSet{node: n.Record.NodeID}
	gone := map[string]bool{}
	var cands []Victim
	for _, b := range p.byNode[s.node] {
		switch {
		case b.Queued:
		case p.freed[b.ID]:
			gone[b.ID] = true
			s.stopping = append(s.stopping, b.ID)
		default:
			if why := p.why(t, cls, reclaim, b); why != "" {
				cands = append(cands, p.victim(b, why))
			}
		}
	}
	if p.fitsAfter(n, r, gone) {
		if len(s.stopping) == 0 {
			return nil // it fits without anyone stopping: placement had its reasons
		}
		return s
	}
	slices.SortFunc(cands, func(a, b Victim) int {
		return cmp.Or(cmp.Compare(a.GPUSeconds, b.GPUSeconds), cmp.Compare(cpuSeconds(a, p.in.Now), cpuSeconds(b, p.in.Now)),
			heldSince(b.Run).Compare(heldSince(a.Run)))
	})
	fits := false
	for _, v := range cands {
		gone[v.RunID], s.victims = true, append(s.victims, v)
		if fits = p.fitsAfter(n, r, gone); fits {
			break
		}
	}
	if !fits {
		return nil
	}
	// Drop the costliest victims the others already make room without.
	for i := len(s.victims) - 1; i >= 0; i-- {
		id := s.victims[i].RunID
		if delete(gone, id); p.fitsAfter(n, r, gone) {
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
	if bt := p.tenant(b.TenantOf()); reclaim && bt != t && bt.pol.Cohort == t.pol.Cohort && overNominal(bt) {
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
	if b.StartedAt != nil {
		return *b.StartedAt
	}
	return b.PhaseSince
}

// cpuSeconds is the CPU-millisecond-seconds v loses: the tie-break among
// victims without cards.
func cpuSeconds(v Victim, now time.Time) float64 {
	return float64(v.Run.Request.Resources.CPUMillis) * now.Sub(heldSince(v.Run)).Seconds()
}

// fitsAfter reports whether r fits on n once the Runs in gone stop,
// beside what stays, the node's queue (which starts first) and the places
// earlier preemptors of this pass claimed there.
func (p *planner) fitsAfter(n *placement.Node, r *schemas.Run, gone map[string]bool) bool {
	free, running := n.Record.Capacity, make([]placement.Booking, 0, len(n.Running))
	for _, b := range n.Running {
		if !gone[b.RunID] {
			free, running = free.Sub(b.Resources), append(running, b)
		}
	}
	need, count := r.Request.Resources, len(running)+1
	for _, c := range p.claims[n.Record.NodeID] {
		need, count = need.Add(c.res), count+1
	}
	for _, q := range n.Queued {
		need, count = need.Add(q.Resources), count+1
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

// claim is a place a preemptor waits for.
type claim struct {
	runID string
	res   schemas.Resources
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
