package usage

import (
	"cmp"
	"slices"
	"time"

	"github.com/warmfleet/warmfleet/internal/metrics"
	"github.com/warmfleet/warmfleet/schemas"
)

// Figures are the ledger's Prometheus figures at now: cost by tenant and
// GPU model, each budgeted tenant's spend and budget (once WF_USAGE is
// read), and the waiting Runs by tenant and wait code.
func (l *Ledger) Figures(now time.Time) metrics.Cost {
	var c metrics.Cost
	tenants := map[string]bool{}
	l.mu.Lock()
	for k, usd := range l.totals {
		c.USD = append(c.USD, metrics.CostUSD{Tenant: k.tenant, GPUModel: k.model, USD: usd})
		tenants[k.tenant] = true
	}
	synced := l.synced
	l.mu.Unlock()
	active := l.active.ActiveRuns()
	waiting := map[[2]string]int{}
	for _, r := range active {
		tenants[r.TenantOf()] = true
		if code, ok := waitCode(r); ok {
			waiting[[2]string{r.TenantOf(), code}]++
		}
	}
	for k, n := range waiting {
		c.Waiting = append(c.Waiting, metrics.RunsWaiting{Tenant: k[0], WaitCode: k[1], Runs: n})
	}
	pol := l.policy.Current()
	for t := range pol.Tenants {
		tenants[t] = true
	}
	for t := range tenants {
		b := pol.Tenant(t).Budget
		if b == nil || !synced {
			continue
		}
		spent, _, _ := l.Spend(t, *b, now)
		c.Tenants = append(c.Tenants, metrics.TenantSpend{Tenant: t, SpendUSD: spent, BudgetUSD: b.AmountUSD})
	}
	slices.SortFunc(c.USD, func(a, b metrics.CostUSD) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.GPUModel, b.GPUModel))
	})
	slices.SortFunc(c.Tenants, func(a, b metrics.TenantSpend) int { return cmp.Compare(a.Tenant, b.Tenant) })
	slices.SortFunc(c.Waiting, func(a, b metrics.RunsWaiting) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.WaitCode, b.WaitCode))
	})
	return c
}

// waitCode is why r waits: its wait code, "queued" in a node's queue,
// "none" not decided yet; ok is false for a Run that holds its place.
func waitCode(r *schemas.Run) (string, bool) {
	switch {
	case r.Phase == schemas.PhaseAccepted && r.WaitCode != "":
		return string(r.WaitCode), true
	case r.Phase == schemas.PhaseAccepted:
		return "none", true
	case r.Queued && !r.Phase.Terminal():
		return "queued", true
	}
	return "", false
}
