package queue

import (
	"cmp"
	"maps"
	"slices"

	"github.com/warmfleet/warmfleet/schemas"
)

// tenantState is one tenant in a pass: its policy, what it holds, its
// budget answer and its waiting Runs of the level being served.
type tenantState struct {
	name string
	pol  schemas.TenantPolicy
	use  usage
	// freed is the part of use held by Runs that stop or were chosen to
	// in this pass.
	freed   usage
	waiting []*schemas.Run // of the level being served, oldest first
	next    int

	// shareOf caches share while shareOK: it moves only as use does.
	shareOf float64
	shareOK bool

	budgetAsked bool
	over        bool
	overWhy     string
	// stopAsked, stop and stopWhy cache BudgetStops' answer for the pass.
	stopAsked bool
	stop      bool
	stopWhy   string
}

// tenant returns t's state, made on first use.
func (p *planner) tenant(name string) *tenantState {
	t, ok := p.tenants[name]
	if !ok {
		t = &tenantState{name: name, pol: p.in.Policy.Tenant(name)}
		p.tenants[name] = t
		p.cohorts = nil // membership is worked out again when next asked
	}
	return t
}

// cohort is every tenant of this pass (listed in the policy, holding or
// waiting) whose cohort is c.
func (p *planner) cohort(c string) []*tenantState {
	if p.cohorts == nil {
		for name := range p.in.Policy.Tenants {
			p.tenant(name)
		}
		p.cohorts = map[string][]*tenantState{}
		for _, name := range slices.Sorted(maps.Keys(p.tenants)) {
			if t := p.tenants[name]; t.pol.Cohort != "" {
				p.cohorts[t.pol.Cohort] = append(p.cohorts[t.pol.Cohort], t)
			}
		}
	}
	return p.cohorts[c]
}

// class is r's priority class; a class the policy no longer defines is
// value 0 and preempts nothing.
func (p *planner) class(r *schemas.Run) schemas.PriorityClass {
	c, ok := p.in.Policy.Class(r.Request.Priority)
	if !ok {
		return schemas.PriorityClass{Name: c.Name}
	}
	return c
}

// level is the waiting Runs of one priority value, by tenant.
type level struct {
	value   int
	tenants []*tenantState
}

// levels groups the waiting Runs by priority value, highest first, and
// within each by tenant, oldest first (CreatedAt, then id).
func (p *planner) levels() []level {
	byValue := map[int]map[string][]*schemas.Run{}
	for _, r := range p.in.Waiting {
		v := p.class(r).Value
		if byValue[v] == nil {
			byValue[v] = map[string][]*schemas.Run{}
		}
		byValue[v][r.TenantOf()] = append(byValue[v][r.TenantOf()], r)
	}
	values := slices.Sorted(maps.Keys(byValue))
	slices.Reverse(values)
	out := make([]level, 0, len(values))
	for _, v := range values {
		l := level{value: v}
		for _, name := range slices.Sorted(maps.Keys(byValue[v])) {
			runs := byValue[v][name]
			slices.SortFunc(runs, olderFirst)
			l.tenants = append(l.tenants, &tenantState{name: name, waiting: runs})
		}
		out = append(out, l)
	}
	return out
}

func olderFirst(a, b *schemas.Run) int {
	return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
}

// serve takes the level's Runs one at a time: first the preemptors whose
// recorded wait holds a place (oldest first), whose claims are then as
// this pass finds them for everyone after; then each from the tenant with
// the lowest weighted dominant share now (ties: the tenant whose next Run
// is older). A Run that waits does not stop the next.
func (p *planner) serve(l level) {
	var claimants []*schemas.Run
	active := make([]*tenantState, 0, len(l.tenants))
	for _, lt := range l.tenants {
		t := p.tenant(lt.name)
		t.waiting, t.next = lt.waiting[:0:0], 0
		for _, r := range lt.waiting {
			if _, ok := claimedNode(r); ok {
				claimants = append(claimants, r)
			} else {
				t.waiting = append(t.waiting, r)
			}
		}
		if len(t.waiting) > 0 {
			active = append(active, t)
		}
	}
	slices.SortFunc(claimants, olderFirst)
	for _, r := range claimants {
		p.take(p.tenant(r.TenantOf()), r)
	}
	for len(active) > 0 {
		best := 0
		for i := 1; i < len(active); i++ {
			if p.before(active[i], active[best]) {
				best = i
			}
		}
		t := active[best]
		p.take(t, t.waiting[t.next])
		if t.next++; t.next == len(t.waiting) {
			active = slices.Delete(active, best, best+1)
		}
	}
}

// before reports whether tenant a is served before b.
func (p *planner) before(a, b *tenantState) bool {
	sa, sb := p.share(a), p.share(b)
	if sa != sb {
		return sa < sb
	}
	return olderFirst(a.waiting[a.next], b.waiting[b.next]) < 0
}

// share is t's weighted dominant share: the largest fraction of the live
// fleet's GPUs, CPU or memory it holds, over its weight.
func (p *planner) share(t *tenantState) float64 {
	if t.shareOK {
		return t.shareOf
	}
	frac := func(used, total int64) float64 {
		if total <= 0 {
			return 0
		}
		return float64(used) / float64(total)
	}
	gpus := t.use.value(dimGPUs, "*")
	s := max(frac(gpus, p.totals.GPUCount), frac(t.use.cpu, p.totals.CPUMillis), frac(t.use.mem, p.totals.MemoryBytes))
	t.shareOf, t.shareOK = s/t.pol.Weight, true
	return t.shareOf
}
