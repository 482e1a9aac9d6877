package queue

import (
	"time"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/schemas"
)

// Input is what one scheduling pass plans over.
type Input struct {
	Now    time.Time
	Policy *policy.Snapshot
	// Fleet is the pass's fleet; Plan books on it as it places, so later
	// decisions see earlier ones.
	Fleet *placement.Fleet
	// Booked are the Runs booked on a node (placed to running, queued or
	// not); Waiting the accepted Runs due a decision.
	Booked, Waiting []*schemas.Run
	// Budget reports whether a tenant is past its budget, and why (what
	// it spent of what, for which period); nil: no budgets.
	Budget func(tenant string) (over bool, why string)
	// BudgetStops reports whether a tenant's booked Runs are to be stopped:
	// its spend, read in full, is past a budget that stops running Runs
	// (a spend not read yet makes Runs wait, never stops one); nil: none.
	BudgetStops func(tenant string) (stop bool, why string)
	// Decide makes one placement decision for r over fleet.
	Decide func(r *schemas.Run, fleet *placement.Fleet) (schemas.BookingDecision, error)
	// UnknownRuntime is how long a booking without a max runtime holds
	// its place (placement.Config.UnknownRuntime).
	UnknownRuntime time.Duration
	// DecideAll turns the re-decision rule off: every waiting Run is
	// decided (a capacity provider's answer moves with its rentals, which
	// nothing here sees).
	DecideAll bool
}

// Kind is what an Action does.
type Kind string

const (
	// KindPlace books Run on Decision.Winner (queued when WinnerQueued).
	KindPlace Kind = "place"
	// KindWait records why Run waits: Code is no_capacity (Decision says
	// why no node takes it), quota or budget, or preempting while the
	// Runs it preempted still stop.
	KindWait Kind = "wait"
	// KindPreempt stops Victims for Run, which waits (preempting) with
	// Decision, whose Victims name them.
	KindPreempt Kind = "preempt"
	// KindBudgetStop stops Run, whose tenant is past a budget that stops
	// running Runs (Message says why).
	KindBudgetStop Kind = "budget_stop"
)

// Action is one step of a planned pass, for the scheduler to apply in order.
type Action struct {
	Kind     Kind
	Run      *schemas.Run
	Decision schemas.BookingDecision
	Code     schemas.Code
	Summary  string
	Message  string
	// GPUModel is the model of the winner's cards (KindPlace).
	GPUModel string
	Victims  []Victim
}

// Victim is a booked Run a preemption stops.
type Victim struct {
	Run *schemas.Run
	schemas.Victim
}

// Result is a planned pass.
type Result struct {
	Actions []Action
	// Decisions counts placement decisions made; Skipped the waiting Runs
	// the re-decision rule left as they were.
	Decisions, Skipped int
	// Errors are decisions that could not be made (a Run's bad image).
	Errors []error
}

// Plan plans one pass: the budget stops, then every waiting Run in
// serving order (priority value, then the tenant with the lowest weighted
// dominant share, recomputed as Runs book, then the oldest), each placed,
// preempting, or waiting, decided only when something it depends on
// changed since memo last saw it.
func Plan(in Input, memo *Memo) Result {
	if in.Policy == nil {
		in.Policy = policy.Static(schemas.SchedulingPolicy{}, "")
	}
	p := newPlanner(in, memo)
	p.budgetStops()
	for _, level := range p.levels() {
		p.serve(level)
	}
	memo.endPass()
	return p.res
}

// planner is one pass in progress.
type planner struct {
	in      Input
	memo    *Memo
	keys    passKeys
	res     Result
	tenants map[string]*tenantState
	cohorts map[string][]*tenantState
	// totals is what the live nodes offer: the denominators of shares.
	totals schemas.Resources
	// byNode are the booked Runs on each node.
	byNode map[string][]*schemas.Run
	// freed are Runs that stop or were chosen to in this pass: their
	// place counts as free for victim searches.
	freed map[string]bool
	// claims are the places preemptors wait for, by node: those their
	// recorded wait names, and those chosen in this pass.
	claims map[string][]claim
	// blocked holds, per Shape, a decision with no eligible node at all.
	blocked map[Shape]*schemas.BookingDecision
	// fruitless are the victim searches of this pass that found nothing.
	fruitless map[searchKey]bool
	// unclaimed is the fleet without the nodes held for preemptors (those
	// named by unclaimedKey) against a Run, made when a winner is held.
	unclaimed    *placement.Fleet
	unclaimedKey string
}

func newPlanner(in Input, memo *Memo) *planner {
	p := &planner{in: in, memo: memo, tenants: map[string]*tenantState{}, byNode: map[string][]*schemas.Run{},
		freed: map[string]bool{}, claims: map[string][]claim{}, blocked: map[Shape]*schemas.BookingDecision{}, fruitless: map[searchKey]bool{}}
	for _, n := range in.Fleet.Nodes {
		if rec := &n.Record; rec.State == schemas.NodeReady && rec.Live(in.Now) {
			p.totals = p.totals.Add(rec.Capacity)
		}
	}
	for _, r := range in.Booked {
		p.tenant(r.TenantOf()).hold(r.Request.Resources, p.bookedModel(r), 1)
		p.byNode[r.NodeID] = append(p.byNode[r.NodeID], r)
		if r.Stopping != "" {
			p.free(r)
		}
	}
	// A preemptor's recorded wait holds its place until it is served
	// again in this pass, which serves it first among its class: only
	// higher classes, which a claim does not hold back, come before.
	for _, r := range in.Waiting {
		if node, ok := claimedNode(r); ok {
			p.claims[node] = append(p.claims[node], claim{r.ID, r.Request.Resources, p.class(r).Value})
		}
	}
	p.keys = memo.keysFor(in, p.byNode, p.claims)
	return p
}

// free counts booked Run r as stopping: its place is free for victim
// searches, and what it holds no longer makes its tenant a borrower.
func (p *planner) free(r *schemas.Run) {
	if p.freed[r.ID] {
		return
	}
	p.freed[r.ID] = true
	p.tenant(r.TenantOf()).freed.add(r.Request.Resources, p.bookedModel(r), 1)
}

// bookedModel is the model of the cards of booked Run r's node.
func (p *planner) bookedModel(r *schemas.Run) string {
	if n := p.in.Fleet.Node(r.NodeID); n != nil {
		return NodeGPUModel(n.Record)
	}
	return ""
}

// NodeGPUModel is the model of a node's cards ("" without any): what a
// Run booked there counts under in quotas and is priced as.
func NodeGPUModel(rec schemas.NodeRecord) string {
	if rec.Facts == nil {
		return ""
	}
	acc := &rec.Facts.Host.Accelerator
	for _, c := range acc.Cards {
		if c.Model != "" {
			return c.Model
		}
	}
	for _, d := range acc.Devices {
		if d.Model != "" {
			return d.Model
		}
	}
	return ""
}

// budgetStops stops the booked Runs of tenants past a budget that stops
// running Runs: a queued one ends at once, holding nothing.
func (p *planner) budgetStops() {
	for _, r := range p.in.Booked {
		t := p.tenant(r.TenantOf())
		if r.Stopping != "" || r.CancelRequested || t.pol.Budget == nil || !t.pol.Budget.StopRunning {
			continue
		}
		if stop, why := p.stopsBudget(t); stop {
			p.free(r)
			p.res.Actions = append(p.res.Actions, Action{Kind: KindBudgetStop, Run: r, Code: schemas.CodeBudgetExceeded, Message: why})
		}
	}
}

// stopsBudget asks once per pass whether t's booked Runs are to be
// stopped for its budget.
func (p *planner) stopsBudget(t *tenantState) (bool, string) {
	if p.in.BudgetStops == nil {
		return false, ""
	}
	if !t.stopAsked {
		t.stopAsked = true
		t.stop, t.stopWhy = p.in.BudgetStops(t.name)
	}
	return t.stop, t.stopWhy
}

// overBudget asks once per pass whether t is past its budget.
func (p *planner) overBudget(t *tenantState) (bool, string) {
	if t.pol.Budget == nil || p.in.Budget == nil {
		return false, ""
	}
	if !t.budgetAsked {
		t.budgetAsked = true
		t.over, t.overWhy = p.in.Budget(t.name)
	}
	return t.over, t.overWhy
}
