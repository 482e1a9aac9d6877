package metrics_test

import (
	"net/http/httptest"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/warmfleet/warmfleet/internal/metrics"
)

// TestCostMetrics: cost by tenant and GPU model is a counter, spend and
// budget gauges per tenant, waiting Runs by tenant and wait code a gauge
// reported only once the cache is synced.
func TestCostMetrics(t *testing.T) {
	cp := &fakeCP{}
	cost := metrics.Cost{
		USD:     []metrics.CostUSD{{Tenant: "acme", GPUModel: "H100", USD: 300}, {Tenant: "acme", USD: 2.5}},
		Tenants: []metrics.TenantSpend{{Tenant: "acme", SpendUSD: 550, BudgetUSD: 500}},
		Waiting: []metrics.RunsWaiting{{Tenant: "acme", WaitCode: "budget", Runs: 2}, {Tenant: "beta", WaitCode: "quota", Runs: 1}},
	}
	cp.set(metrics.ControlPlane{Cost: cost})
	srv := httptest.NewServer(metrics.Handler(metrics.NewControlPlaneRegistry(cp.Metrics), nil))
	defer srv.Close()
	fams := scrape(t, srv.URL)
	if fams["warmfleet_cost_usd_total"].GetType() != dto.MetricType_COUNTER {
		t.Errorf("warmfleet_cost_usd_total is a %s", fams["warmfleet_cost_usd_total"].GetType())
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"warmfleet_cost_usd_total", map[string]string{"tenant": "acme", "gpu_model": "H100"}, 300},
		{"warmfleet_cost_usd_total", map[string]string{"tenant": "acme", "gpu_model": ""}, 2.5},
		{"warmfleet_tenant_spend_usd", map[string]string{"tenant": "acme"}, 550},
		{"warmfleet_tenant_budget_usd", map[string]string{"tenant": "acme"}, 500},
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if _, ok := fams["warmfleet_runs_waiting"]; ok {
		t.Error("waiting Runs reported before the cache synced")
	}
	cp.set(metrics.ControlPlane{Cost: cost, PhasesSynced: true})
	fams = scrape(t, srv.URL)
	if got := value(t, fams, "warmfleet_runs_waiting", map[string]string{"tenant": "acme", "wait_code": "budget"}); got != 2 {
		t.Errorf("acme's Runs waiting on budget: %v", got)
	}
	if got := value(t, fams, "warmfleet_runs_waiting", map[string]string{"tenant": "beta", "wait_code": "quota"}); got != 1 {
		t.Errorf("beta's Runs waiting on quota: %v", got)
	}
}
