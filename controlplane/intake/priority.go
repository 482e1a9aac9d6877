package intake

import (
	"slices"

	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/schemas"
)

// checkPriority refuses a Run naming a priority class the policy does not
// define (priority_unknown), listing the classes it does. The empty
// priority is the default class and always known.
func checkPriority(p *policy.Snapshot, req schemas.RunRequest) error {
	if req.Priority == "" {
		return nil
	}
	if _, ok := p.Class(req.Priority); ok {
		return nil
	}
	reason := "the scheduling policy configures no priority classes; submit without priority"
	if names := p.ClassNames(); names != "" {
		reason = "the scheduling policy has no priority class " + req.Priority + "; use one of " + names + ", or none for the default"
	}
	return &schemas.Refusal{Code: schemas.CodePriorityUnknown, Field: "priority", Reason: reason}
}

// retryOf is a Run's effective retry policy: its request's, else its
// tenant's default, else nil (node loss alone is retried). It is a copy:
// the Run keeps it whatever the policy later says.
func retryOf(p *policy.Snapshot, tenant string, req schemas.RunRequest) *schemas.RetryPolicy {
	r := req.Retry
	if r == nil {
		r = p.Tenant(tenant).Retry
	}
	if r == nil {
		return nil
	}
	c := *r
	c.On = slices.Clone(r.On)
	return &c
}

// spotOf is a Run's effective spot policy: its request's, else its
// tenant's, else never.
func spotOf(p *policy.Snapshot, tenant string, req schemas.RunRequest) schemas.SpotPolicy {
	if req.Spot != schemas.SpotDefault {
		return req.Spot
	}
	if s := p.Tenant(tenant).Spot; s != schemas.SpotDefault {
		return s
	}
	return schemas.SpotNever
}
