// Package policy owns the control plane's scheduling policy: the policy
// file read again when it changes (a file that does not validate keeps the
// policy last read, and says why), and the Snapshot the scheduler, intake,
// the rental policy and the budgets read it through.
package policy

import (
	"strings"

	"github.com/warmfleet/warmfleet/schemas"
)

// Snapshot is one validated policy. Version changes whenever the policy
// does, so a scheduling pass can tell that a reload moved quotas.
type Snapshot struct {
	schemas.SchedulingPolicy
	Version string
}

// Static is a Snapshot of p as given (tests, and the empty policy of a
// control plane without a policy file).
func Static(p schemas.SchedulingPolicy, version string) *Snapshot {
	return &Snapshot{SchedulingPolicy: p, Version: version}
}

// Source gives the current policy.
type Source interface {
	Current() *Snapshot
}

// Class resolves a Run's priority class name ("" is the default class).
// ok is false for a name the policy does not define.
func (s *Snapshot) Class(name string) (c schemas.PriorityClass, ok bool) {
	if name == "" {
		name = s.DefaultPriority
		if name == "" {
			return schemas.PriorityClass{}, true
		}
	}
	for _, c := range s.PriorityClasses {
		if c.Name == name {
			return c, true
		}
	}
	return schemas.PriorityClass{Name: name}, false
}

// Tenant is tenant's policy: its own entry, else Default; Weight is at
// least something positive (1 when unset).
func (s *Snapshot) Tenant(name string) schemas.TenantPolicy {
	tp, ok := s.Tenants[name]
	if !ok {
		tp = s.Default
	}
	if tp.Weight <= 0 {
		tp.Weight = 1
	}
	return tp
}

// OwnedRate is the USD per GPU-hour of a card of model on a node with no
// price of its own: the longest matching key of OwnedGPUHourRates ("*"
// last), else 0.
func (s *Snapshot) OwnedRate(model string) float64 {
	best, rate := -1, 0.0
	m := strings.ToLower(model)
	for k, v := range s.OwnedGPUHourRates {
		l := len(k)
		if k == "*" {
			l = 0
		} else if !strings.Contains(m, strings.ToLower(k)) {
			continue
		}
		if l > best {
			best, rate = l, v
		}
	}
	return rate
}

// Current makes a Snapshot its own Source: a policy that never changes.
func (s *Snapshot) Current() *Snapshot { return s }
