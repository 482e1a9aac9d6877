package rentals

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// Budget says whether a tenant may spend more (the usage ledger's budgets).
type Budget interface {
	// Allows reports whether tenant may start spending expectedUSD more
	// within its budget at now, and why not (its spend, its budget, the
	// period).
	Allows(tenant string, expectedUSD float64, now time.Time) (bool, string)
}

// expectedCost is what renting at pricePerHour for r is expected to cost:
// r's max_runtime_seconds, else placement's UnknownRuntime, at that price.
func (m *Manager) expectedCost(r schemas.Run, pricePerHour float64) float64 {
	return pricePerHour * placement.Hold(r.Request, m.placement.UnknownRuntime).Hours()
}

// withinBudget refuses, with a CodeBudget refusal naming the tenant, its
// spend and budget, a rental at pricePerHour for r that its tenant's
// budget does not allow; nil without a Budget.
func (m *Manager) withinBudget(r schemas.Run, pricePerHour float64) error {
	if m.cfg.Budget == nil {
		return nil
	}
	expected := m.expectedCost(r, pricePerHour)
	ok, why := m.cfg.Budget.Allows(r.TenantOf(), expected, m.now())
	if ok {
		return nil
	}
	m.log.Info("not renting: past the tenant's budget", zap.String("run_id", r.ID), zap.String("tenant", r.TenantOf()),
		zap.Float64("expected_usd", expected), zap.String("why", why))
	return fmt.Errorf("rent for run %s: %w", r.ID,
		&schemas.Refusal{Code: schemas.CodeBudget, Field: "tenants." + r.TenantOf() + ".budget.amount_usd", Reason: why})
}

// offerPrice is an offer's USD per hour.
func offerPrice(micros int64) float64 { return float64(micros) / 1e6 }
