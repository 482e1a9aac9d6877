package queue

import (
	"slices"
	"strings"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// take serves one waiting Run of t: a budget or quota wait needs no
// decision; otherwise it is decided (unless the re-decision rule skips
// it) and placed, or preempts, or waits.
func (p *planner) take(t *tenantState, r *schemas.Run) {
	if over, why := p.overBudget(t); over {
		p.memo.forget(r.ID)
		p.unclaim(r.ID)
		p.wait(r, schemas.CodeBudget, "budget: tenant "+t.name+" is past its budget", "tenant "+t.name+" "+why+"; waits for the next period", nil)
		return
	}
	if e := p.quotaExcess(t, r.Request.Resources, requestModel(r)); e != nil {
		p.memo.forget(r.ID)
		p.unclaim(r.ID)
		s, m := e.wait(t.name)
		p.wait(r, schemas.CodeQuota, s, m, nil)
		return
	}
	shape := ShapeOf(r.Request)
	key := p.memo.runKey(&p.keys, r, shape)
	if !p.in.DecideAll && p.memo.fresh(r, key, p.in.Now) {
		p.res.Skipped++
		return
	}
	// Decided again, r holds a place only if it preempts again.
	p.unclaim(r.ID)
	cls := p.class(r)
	if d := p.blocked[shape]; d != nil && !p.in.DecideAll {
		p.skipBlocked(t, r, cls, *d, key)
		return
	}
	d, err := p.in.Decide(r, p.in.Fleet)
	p.res.Decisions++
	if err != nil {
		p.res.Errors = append(p.res.Errors, err)
		return
	}
	p.memo.dependsOn(&p.keys, shape, &d)
	p.memo.decided(r.ID, p.memo.runKey(&p.keys, r, shape), p.in.Now)
	if d.Winner != "" {
		p.won(t, r, cls, d)
		return
	}
	if noneEligible(&d) {
		p.blocked[shape] = &d
	}
	if p.preempt(t, r, cls, d) {
		return
	}
	p.res.Actions = append(p.res.Actions, Action{Kind: KindWait, Run: r, Decision: d, Code: schemas.CodeNoCapacity})
}

// won places r on d's winner, unless its cards' model puts t over quota,
// or r would only queue there and may preempt instead. A winner held for
// a preemptor is decided again without the held nodes.
func (p *planner) won(t *tenantState, r *schemas.Run, cls schemas.PriorityClass, d schemas.BookingDecision) {
	if by := p.claimedAgainst(r, d); by != "" {
		held := heldFor(d, by)
		alt, err := p.in.Decide(r, p.unclaimedFleet(r))
		p.res.Decisions++
		if err != nil || alt.Winner == "" {
			p.res.Actions = append(p.res.Actions, Action{Kind: KindWait, Run: r, Decision: held, Code: schemas.CodeNoCapacity})
			return
		}
		d = alt
	}
	model := NodeGPUModel(p.in.Fleet.Node(d.Winner).Record)
	if e := p.quotaExcess(t, r.Request.Resources, model); e != nil {
		p.memo.forget(r.ID)
		s, m := e.wait(t.name)
		p.wait(r, schemas.CodeQuota, s, m, &d)
		return
	}
	if d.WinnerQueued && p.preempt(t, r, cls, d) {
		return
	}
	p.in.Fleet.Book(d.Winner, placement.Booking{RunID: r.ID, Resources: r.Request.Resources, ExpectedEnd: p.in.Now.Add(placement.Hold(r.Request, p.in.UnknownRuntime)),
		GPUs: d.GPUs, Want: r.Request.GPU, Fetching: d.FetchFirst, ReadyAt: placement.ReadyAt(d, p.in.Now)}, d.Queues())
	t.hold(r.Request.Resources, model, 1)
	p.res.Actions = append(p.res.Actions, Action{Kind: KindPlace, Run: r, Decision: d, GPUModel: model})
}

// skipBlocked serves a Run whose shape already found no node in this pass:
// it is not decided. It may still preempt (the shape's decision says
// which nodes are only busy); else it keeps the capacity wait it has, or
// is given the shape's when it has none.
func (p *planner) skipBlocked(t *tenantState, r *schemas.Run, cls schemas.PriorityClass, d schemas.BookingDecision, key uint64) {
	p.res.Skipped++
	p.memo.decided(r.ID, key, p.in.Now)
	d.RunID, d.Attempt = r.ID, r.Attempt+1
	if p.preempt(t, r, cls, d) {
		return
	}
	if !capacityWait(r) {
		p.res.Actions = append(p.res.Actions, Action{Kind: KindWait, Run: r, Decision: d, Code: schemas.CodeNoCapacity})
	}
}

// capacityWait reports whether r's recorded wait is a capacity one. Every
// wait is recorded with its code (lifecycle.Wait); one without is from
// before wait codes, when waits were capacity ones.
func capacityWait(r *schemas.Run) bool {
	return r.Waiting != "" && (r.WaitCode == "" || r.WaitCode == schemas.CodeNoCapacity)
}

// wait records a wait that is not a capacity one, unless r has it already.
func (p *planner) wait(r *schemas.Run, code schemas.Code, summary, message string, d *schemas.BookingDecision) {
	if r.Waiting == summary {
		return
	}
	a := Action{Kind: KindWait, Run: r, Code: code, Summary: summary, Message: message}
	if d != nil {
		a.Decision = *d
	}
	p.res.Actions = append(p.res.Actions, a)
}

func requestModel(r *schemas.Run) string {
	if r.Request.GPU == nil {
		return ""
	}
	return r.Request.GPU.Model
}

// claimedAgainst names a preemptor that d's winner is held for and that
// r would take the place of ("" when none): r may queue on no claimed
// node (its queue starts before the preemptor), and start on one only
// beside every claim, once the Runs stopping there are gone.
func (p *planner) claimedAgainst(r *schemas.Run, d schemas.BookingDecision) string {
	i := slices.IndexFunc(p.claims[d.Winner], func(c claim) bool { return p.holds(c, r) })
	if i < 0 {
		return ""
	}
	if d.Queues() || !p.fitsAfter(p.in.Fleet.Node(d.Winner), r, p.freed, false) {
		return p.claims[d.Winner][i].runID
	}
	return ""
}

// heldFor is d with its winner refused: the node is held for preemptor by.
func heldFor(d schemas.BookingDecision, by string) schemas.BookingDecision {
	d.Candidates = slices.Clone(d.Candidates)
	for i := range d.Candidates {
		if c := &d.Candidates[i]; c.NodeID == d.Winner {
			c.Eligible, c.Reason, c.Detail = false, schemas.CodePreempting, "held for "+by+", which preempted Runs here to start"
		}
	}
	d.Winner, d.WinnerQueued, d.GPUs = "", false, nil
	return d
}

// unclaimedFleet is the pass's fleet without the nodes held for
// preemptors against r. It shares the fleet's nodes, so bookings made on
// either show in both; it is indexed again only when the held nodes change.
func (p *planner) unclaimedFleet(r *schemas.Run) *placement.Fleet {
	var held []string
	for node, cs := range p.claims {
		if slices.ContainsFunc(cs, func(c claim) bool { return p.holds(c, r) }) {
			held = append(held, node)
		}
	}
	slices.Sort(held)
	key := strings.Join(held, "\x00")
	if p.unclaimed == nil || p.unclaimedKey != key {
		nodes := make([]*placement.Node, 0, len(p.in.Fleet.Nodes))
		for _, n := range p.in.Fleet.Nodes {
			if _, found := slices.BinarySearch(held, n.Record.NodeID); !found {
				nodes = append(nodes, n)
			}
		}
		p.unclaimed, p.unclaimedKey = placement.NewFleet(nodes), key
	}
	return p.unclaimed
}
