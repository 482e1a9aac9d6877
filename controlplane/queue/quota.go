package queue

import (
	"fmt"
	"strings"

	"github.com/warmfleet/warmfleet/schemas"
)

// usage is what a tenant's booked Runs hold. Queued bookings count too:
// one leaves its node's queue without another quota check, so admitting it
// to the queue is admitting it.
type usage struct {
	runs, cpu, mem int64
	// gpus counts cards by model, lowercased ("" for a Run booked before
	// its node's model is known).
	gpus map[string]int64
}

// hold counts (sign 1) or uncounts (-1) a Run of t holding res on cards
// of model.
func (t *tenantState) hold(res schemas.Resources, model string, sign int64) {
	t.use.add(res, model, sign)
	t.shareOK = false
}

// add counts (sign 1) or uncounts (-1) a Run holding res on cards of model.
func (u *usage) add(res schemas.Resources, model string, sign int64) {
	u.runs += sign
	u.cpu += sign * res.CPUMillis
	u.mem += sign * res.MemoryBytes
	if res.GPUCount > 0 {
		if u.gpus == nil {
			u.gpus = map[string]int64{}
		}
		u.gpus[strings.ToLower(model)] += sign * res.GPUCount
	}
}

// countsUnder reports whether a card of model counts under quota key k:
// "*" counts every card, any other key the models that contain it.
func countsUnder(model, k string) bool {
	return k == "*" || (k != "" && strings.Contains(strings.ToLower(model), strings.ToLower(k)))
}

// value is the tenant's use of one quota dimension (key: the GPU model key).
func (u *usage) value(dim, key string) int64 {
	switch dim {
	case dimRuns:
		return u.runs
	case dimCPU:
		return u.cpu
	case dimMemory:
		return u.mem
	}
	var n int64
	for m, c := range u.gpus {
		if countsUnder(m, key) {
			n += c
		}
	}
	return n
}

// Quota dimensions, named as the policy file names them.
const (
	dimRuns   = "runs"
	dimCPU    = "cpu_millis"
	dimMemory = "memory_bytes"
	dimGPUs   = "gpus"
)

// limit is q's nominal on a dimension; ok is false when it sets none.
func limit(q *schemas.Quota, dim, key string) (int64, bool) {
	if q == nil {
		return 0, false
	}
	var p *int64
	switch dim {
	case dimRuns:
		p = q.Runs
	case dimCPU:
		p = q.CPUMillis
	case dimMemory:
		p = q.MemoryBytes
	default:
		v, ok := q.GPUs[key]
		return v, ok
	}
	if p == nil {
		return 0, false
	}
	return *p, true
}

// demand is one dimension a Run adds to its tenant's use.
type demand struct {
	dim, key string
	need     int64
}

// demands lists what a Run holding res on cards of model adds, on every
// dimension q limits.
func demands(q *schemas.Quota, res schemas.Resources, model string) []demand {
	if q == nil {
		return nil
	}
	ds := []demand{{dimRuns, "", 1}, {dimCPU, "", res.CPUMillis}, {dimMemory, "", res.MemoryBytes}}
	if res.GPUCount > 0 {
		for k := range q.GPUs {
			if countsUnder(model, k) {
				ds = append(ds, demand{dimGPUs, k, res.GPUCount})
			}
		}
	}
	out := ds[:0]
	for _, d := range ds {
		if _, ok := limit(q, d.dim, d.key); ok {
			out = append(out, d)
		}
	}
	return out
}

// excess is the first nominal a Run would pass without a cohort to lend.
type excess struct {
	demand
	used, limit int64
	cohort      string
}

// quotaExcess checks what a Run of t holding res on cards of model adds
// against t's quota, borrowing from t's cohort: the cohort's members that
// limit a dimension lend what they do not use of it. nil: it fits.
func (p *planner) quotaExcess(t *tenantState, res schemas.Resources, model string) *excess {
	for _, d := range demands(t.pol.Quota, res, model) {
		lim, _ := limit(t.pol.Quota, d.dim, d.key)
		used := t.use.value(d.dim, d.key)
		if used+d.need <= lim || p.cohortLends(t, d) {
			continue
		}
		return &excess{demand: d, used: used, limit: lim, cohort: t.pol.Cohort}
	}
	return nil
}

// withinNominal reports whether t stays within its own nominal quota
// (borrowing nothing) with a Run holding res on cards of model, and has a
// quota and a cohort at all: only such a tenant reclaims lent quota.
func withinNominal(t *tenantState, res schemas.Resources, model string) bool {
	if t.pol.Quota == nil || t.pol.Cohort == "" {
		return false
	}
	for _, d := range demands(t.pol.Quota, res, model) {
		if lim, _ := limit(t.pol.Quota, d.dim, d.key); t.use.value(d.dim, d.key)+d.need > lim {
			return false
		}
	}
	return true
}

// overNominal reports whether t holds more than its own nominal on any
// dimension it limits, besides what its stopping Runs hold and taken (nil:
// nothing) more: it borrows from its cohort.
func overNominal(t *tenantState, taken *usage) bool {
	q := t.pol.Quota
	if q == nil || t.pol.Cohort == "" {
		return false
	}
	held := func(dim, key string) int64 {
		v := t.use.value(dim, key) - t.freed.value(dim, key)
		if taken != nil {
			v -= taken.value(dim, key)
		}
		return v
	}
	for _, dim := range []string{dimRuns, dimCPU, dimMemory} {
		if lim, ok := limit(q, dim, ""); ok && held(dim, "") > lim {
			return true
		}
	}
	for k, lim := range q.GPUs {
		if held(dimGPUs, k) > lim {
			return true
		}
	}
	return false
}

// cohortLends reports whether t's cohort, as a whole, stays within the
// sum of its members' nominals on d with d.need more: members without a
// limit on d neither lend nor borrow it.
func (p *planner) cohortLends(t *tenantState, d demand) bool {
	if t.pol.Cohort == "" {
		return false
	}
	var nominal, used int64
	for _, m := range p.cohort(t.pol.Cohort) {
		if lim, ok := limit(m.pol.Quota, d.dim, d.key); ok {
			nominal += lim
			used += m.use.value(d.dim, d.key)
		}
	}
	return used+d.need <= nominal
}

// wait is the quota wait of a Run that would pass e.
func (e *excess) wait(tenant string) (summary, message string) {
	label, unit := e.dim, map[string]string{dimRuns: "Runs", dimCPU: "CPU millicores", dimMemory: "bytes of memory"}[e.dim]
	if e.dim == dimGPUs {
		label, unit = fmt.Sprintf("gpus(%s)", e.key), fmt.Sprintf("GPUs (%s)", e.key)
	}
	summary = fmt.Sprintf("quota: %s %d of %d", label, e.used, e.limit)
	message = fmt.Sprintf("tenant %s is at its quota: %d of %d %s", tenant, e.used, e.limit, unit)
	if e.cohort != "" {
		message += fmt.Sprintf(" and its cohort %s has none to lend", e.cohort)
	}
	return summary, message + "; waits until one of its Runs ends"
}
