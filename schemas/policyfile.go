package schemas

import (
	"errors"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/warmfleet/warmfleet/bus/codec"
)

// Limits on a scheduling policy file.
const (
	MaxPolicyBytes      = 1 << 20
	MaxPriorityClasses  = 64
	MaxPriorityValue    = 1_000_000_000
	MaxTenantWeight     = 1e6
	MaxGPUModelKeyBytes = 128
)

// Budget periods (Budget.Period), UTC calendar.
const (
	BudgetDay   = "day"
	BudgetWeek  = "week" // from Monday
	BudgetMonth = "month"
)

// ParseSchedulingPolicy decodes and validates a policy file: strict JSON
// (an unknown field is refused), at most MaxPolicyBytes. The error is a
// *Refusal coded CodeInvalidPolicy naming the field.
func ParseSchedulingPolicy(data []byte) (SchedulingPolicy, error) {
	var p SchedulingPolicy
	if len(data) > MaxPolicyBytes {
		return p, refuse(CodeInvalidPolicy, "", "the policy file is %d bytes; the limit is %d", len(data), MaxPolicyBytes)
	}
	if err := codec.Decode(codec.JSON, data, &p); err != nil {
		if errors.Is(err, codec.ErrUnknownField) {
			return SchedulingPolicy{}, refuse(CodeInvalidPolicy, unknownFieldName(err.Error()), "not a field of the scheduling policy; remove it (docs/scheduling.md lists the fields)")
		}
		return SchedulingPolicy{}, refuse(CodeInvalidPolicy, "", "not a JSON policy object: %s", truncate(err.Error(), 200))
	}
	return p, p.Validate()
}

// Validate refuses a policy the control plane cannot schedule by, with a
// *Refusal coded CodeInvalidPolicy whose field is the path of the
// offending value (priority_classes[1].name, tenants.acme.budget.amount_usd).
func (p *SchedulingPolicy) Validate() error {
	if err := p.validateClasses(); err != nil {
		return err
	}
	if bad := nonNegative(p.GPUHourPrice); bad != "" {
		return refuse(CodeInvalidPolicy, "gpu_hour_price", "USD per GPU-hour must be a finite number of at least 0, not %s", bad)
	}
	for _, k := range slices.Sorted(maps.Keys(p.OwnedGPUHourRates)) {
		f := "owned_gpu_hour_rates." + fieldKey(k)
		if err := validateModelKey(f, k); err != nil {
			return err
		}
		if bad := nonNegative(p.OwnedGPUHourRates[k]); bad != "" {
			return refuse(CodeInvalidPolicy, f, "USD per GPU-hour must be a finite number of at least 0, not %s", bad)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.Tenants)) {
		f := "tenants." + fieldKey(name)
		if !ValidTenant(name) {
			return refuse(CodeInvalidPolicy, f, "a tenant name is 1-32 characters of [a-z0-9-], starting with a letter or digit")
		}
		tp := p.Tenants[name]
		if err := tp.validate(f); err != nil {
			return err
		}
	}
	return p.Default.validate("default")
}

func (p *SchedulingPolicy) validateClasses() error {
	if len(p.PriorityClasses) > MaxPriorityClasses {
		return refuse(CodeInvalidPolicy, "priority_classes", "at most %d classes", MaxPriorityClasses)
	}
	seen := make(map[string]bool, len(p.PriorityClasses))
	for i, c := range p.PriorityClasses {
		f := "priority_classes[" + strconv.Itoa(i) + "]"
		switch {
		case !ValidPriorityName(c.Name):
			return refuse(CodeInvalidPolicy, f+".name", "a class name is 1-63 characters of [a-z0-9_-], starting with a letter or digit")
		case seen[c.Name]:
			return refuse(CodeInvalidPolicy, f+".name", "class %s is defined twice; define each class once", c.Name)
		case c.Value < -MaxPriorityValue || c.Value > MaxPriorityValue:
			return refuse(CodeInvalidPolicy, f+".value", "must be between %d and %d", -MaxPriorityValue, MaxPriorityValue)
		}
		seen[c.Name] = true
	}
	if p.DefaultPriority != "" && !seen[p.DefaultPriority] {
		return refuse(CodeInvalidPolicy, "default_priority", "names no class of priority_classes; name one of them (%s) or leave it out", classList(p.PriorityClasses))
	}
	return nil
}

// ClassNames lists the policy's priority class names, comma-separated,
// for messages ("" when there are none).
func (p *SchedulingPolicy) ClassNames() string { return classList(p.PriorityClasses) }

func classList(cs []PriorityClass) string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.Name
	}
	return strings.Join(names, ", ")
}

func (t *TenantPolicy) validate(field string) error {
	if math.IsNaN(t.Weight) || t.Weight < 0 || t.Weight > MaxTenantWeight {
		return refuse(CodeInvalidPolicy, field+".weight", "a fair-share weight is more than 0 and at most %g (leave it out for 1)", float64(MaxTenantWeight))
	}
	if t.Cohort != "" && !ValidPriorityName(t.Cohort) {
		return refuse(CodeInvalidPolicy, field+".cohort", "a cohort name is 1-63 characters of [a-z0-9_-], starting with a letter or digit")
	}
	if err := t.Quota.validate(field + ".quota"); err != nil {
		return err
	}
	if b := t.Budget; b != nil {
		if bad := nonNegative(b.AmountUSD); bad != "" {
			return refuse(CodeInvalidPolicy, field+".budget.amount_usd", "a budget is a finite number of USD of at least 0, not %s", bad)
		}
		switch b.Period {
		case BudgetDay, BudgetWeek, BudgetMonth:
		default:
			return refuse(CodeInvalidPolicy, field+".budget.period", "must be day, week (from Monday) or month, in UTC")
		}
	}
	if !t.Spot.Valid() {
		return refuse(CodeInvalidPolicy, field+".spot", "must be never, allowed or only (or absent: never)")
	}
	if t.Retry != nil {
		return t.Retry.Validate(field+".retry", CodeInvalidPolicy)
	}
	return nil
}

func (q *Quota) validate(field string) error {
	if q == nil {
		return nil
	}
	for _, l := range []struct {
		name string
		v    *int64
	}{{"runs", q.Runs}, {"cpu_millis", q.CPUMillis}, {"memory_bytes", q.MemoryBytes}} {
		if l.v != nil && *l.v < 0 {
			return refuse(CodeInvalidPolicy, field+"."+l.name, "a quota is at least 0 (leave it out for no limit)")
		}
	}
	for _, k := range slices.Sorted(maps.Keys(q.GPUs)) {
		f := field + ".gpus." + fieldKey(k)
		if err := validateModelKey(f, k); err != nil {
			return err
		}
		if q.GPUs[k] < 0 {
			return refuse(CodeInvalidPolicy, f, "a quota is at least 0 (leave the model out for no limit)")
		}
	}
	return nil
}

// validateModelKey checks a GPU model key: "*" or a model substring.
func validateModelKey(field, k string) error {
	if k == "" || len(k) > MaxGPUModelKeyBytes || !cleanText(k) {
		return refuse(CodeInvalidPolicy, field, "a GPU model key is \"*\" (every card) or a substring of the model, 1-%d bytes of text", MaxGPUModelKeyBytes)
	}
	return nil
}

// nonNegative is "" for a finite v ≥ 0, else what v is.
func nonNegative(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 0):
		return "infinite"
	case v < 0:
		return "negative"
	}
	return ""
}

// fieldKey is a map key as a field path shows it: bounded and printable.
func fieldKey(k string) string {
	if k != "" && cleanText(k) && len(k) <= 64 && !strings.ContainsAny(k, "\n\r\t") {
		return k
	}
	return strconv.Quote(truncate(k, 64))
}
