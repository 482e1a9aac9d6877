package metrics

import "github.com/prometheus/client_golang/prometheus"

// Cost is the control plane's cost figures at one scrape: the usage
// ledger's sums and budgets (controlplane/usage), and the waiting Runs.
type Cost struct {
	// USD is what ended attempts cost, by tenant and GPU model, as the
	// ledger read WF_USAGE (from the start of the oldest budget period on).
	USD []CostUSD
	// Tenants are the tenants with a budget: spend in the current period,
	// current attempts included, and the budget. Empty until the ledger
	// has read WF_USAGE.
	Tenants []TenantSpend
	// Waiting counts the Runs waiting, by tenant and wait code ("queued"
	// for one in a node's queue, "none" for one not decided yet).
	Waiting []RunsWaiting
}

// CostUSD is one tenant's cost on one GPU model ("" for CPU-only).
type CostUSD struct {
	Tenant, GPUModel string
	USD              float64
}

// TenantSpend is one tenant's spend against its budget.
type TenantSpend struct {
	Tenant              string
	SpendUSD, BudgetUSD float64
}

// RunsWaiting is how many of a tenant's Runs wait for one reason.
type RunsWaiting struct {
	Tenant, WaitCode string
	Runs             int
}

var (
	costDesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "cost_usd_total"),
		"USD that ended attempts cost, by tenant and GPU model, summed from WF_USAGE from the start of the oldest budget period (so the same on every replica started in that period).",
		[]string{"tenant", "gpu_model"}, nil)
	spendDesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "tenant_spend_usd"),
		"USD a tenant with a budget has spent in the budget's current period, its current attempts' cost so far included.", []string{"tenant"}, nil)
	budgetDesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "tenant_budget_usd"),
		"A tenant's budget for its period, USD.", []string{"tenant"}, nil)
	waitingDesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "runs_waiting"),
		"Runs waiting, by tenant and wait code (quota, budget, preempting, retry_backoff, no_capacity, …; queued: in a node's queue).", []string{"tenant", "wait_code"}, nil)
)

func describeCost(ch chan<- *prometheus.Desc) {
	ch <- costDesc
	ch <- spendDesc
	ch <- budgetDesc
	ch <- waitingDesc
}

// collectCost sends c's series; the waiting Runs only once the cache is
// synced (they read low before).
func collectCost(ch chan<- prometheus.Metric, c Cost, synced bool) {
	for _, s := range c.USD {
		ch <- prometheus.MustNewConstMetric(costDesc, prometheus.CounterValue, s.USD, s.Tenant, s.GPUModel)
	}
	for _, t := range c.Tenants {
		ch <- prometheus.MustNewConstMetric(spendDesc, prometheus.GaugeValue, t.SpendUSD, t.Tenant)
		ch <- prometheus.MustNewConstMetric(budgetDesc, prometheus.GaugeValue, t.BudgetUSD, t.Tenant)
	}
	if !synced {
		return
	}
	for _, w := range c.Waiting {
		ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(w.Runs), w.Tenant, w.WaitCode)
	}
}
