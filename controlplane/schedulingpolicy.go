package controlplane

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/schemas"
)

// loadPolicy loads the scheduling policy file at path, or gives the empty
// policy (today's scheduling: no classes, quotas or budgets) without one.
func loadPolicy(path string, log *zap.Logger) (policy.Source, error) {
	if path == "" {
		return policy.Static(schemas.SchedulingPolicy{}, ""), nil
	}
	f, err := policy.Load(path, log.Named("policy"))
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w (check it offline with `warmfleet policy check %s`)", err, path)
	}
	return f, nil
}

// policyReloadFailures counts the policy file's changes that did not load.
func policyReloadFailures(src policy.Source) int64 {
	if f, ok := src.(*policy.File); ok {
		return f.ReloadFailures()
	}
	return 0
}
