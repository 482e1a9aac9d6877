package queue

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/schemas"
)

var propClasses = []schemas.PriorityClass{{Name: "urgent", Value: 100, Preempts: true}, {Name: "batch", Value: 0}, {Name: "low", Value: -10}}

// Under random arrivals, completions, preemptions and policy reloads: a
// placement never takes a tenant past its quota unless its cohort lends
// it; no Run a preemption picks is non-preemptible or of a class it may
// not take; and after every pass, no Run waits while its tenant is within
// quota and a node that fits it is free.
func TestPlanProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(t, randomPolicy(rt, 0).SchedulingPolicy)
		for i := range 3 {
			s.node(fmt.Sprintf("n%d", i), 8000, 4, "NVIDIA H100")
		}
		tenants := []string{"a", "b", "c"}
		for step := range rapid.IntRange(1, 60).Draw(rt, "steps") {
			switch rapid.IntRange(0, 9).Draw(rt, "op") {
			case 0, 1, 2, 3:
				s.submit(rapid.SampledFrom(tenants).Draw(rt, "tenant"), rapid.SampledFrom([]int64{1000, 3000}).Draw(rt, "cpu"),
					rapid.Int64Range(0, 3).Draw(rt, "gpus"), func(r *schemas.RunRequest) {
						r.Preemptible = rapid.Bool().Draw(rt, "preemptible")
						r.Priority = rapid.SampledFrom([]string{"", "urgent", "batch", "low", "removed"}).Draw(rt, "priority")
					})
			case 4, 5:
				if ids := s.booked(); len(ids) > 0 {
					s.end(rapid.SampledFrom(ids).Draw(rt, "ends"))
				}
			case 6:
				s.pol = randomPolicy(rt, step+1)
			default:
				s.now = s.now.Add(time.Duration(rapid.IntRange(0, 3000).Draw(rt, "ms")) * time.Millisecond)
				s.checkedPass(rt)
			}
		}
		s.checkedPass(rt)
	})
}

func randomPolicy(rt *rapid.T, n int) *policy.Snapshot {
	p := schemas.SchedulingPolicy{PriorityClasses: propClasses, DefaultPriority: "batch", Tenants: map[string]schemas.TenantPolicy{}}
	for _, name := range []string{"a", "b", "c"} {
		tp := schemas.TenantPolicy{Weight: float64(rapid.IntRange(1, 3).Draw(rt, "weight")), Cohort: rapid.SampledFrom([]string{"", "c1"}).Draw(rt, "cohort")}
		if rapid.Bool().Draw(rt, "quota") {
			tp.Quota = &schemas.Quota{GPUs: map[string]int64{rapid.SampledFrom([]string{"*", "h100"}).Draw(rt, "key"): rapid.Int64Range(0, 6).Draw(rt, "gpus")}}
			if rapid.Bool().Draw(rt, "runs") {
				tp.Quota.Runs = ptr(rapid.Int64Range(1, 4).Draw(rt, "runs"))
			}
		}
		p.Tenants[name] = tp
	}
	return policy.Static(p, fmt.Sprint("v", n))
}

// booked lists the booked Runs' ids.
func (s *sim) booked() []string {
	var ids []string
	for _, r := range s.sorted() {
		if r.Phase != schemas.PhaseAccepted {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// usageNow recounts every tenant's use from the Runs as they are.
func (s *sim) usageNow() map[string]*tenantState {
	ts := map[string]*tenantState{}
	for name := range s.pol.Tenants {
		ts[name] = &tenantState{name: name, pol: s.pol.Tenant(name)}
	}
	for _, r := range s.runs {
		if r.Phase != schemas.PhaseAccepted {
			ts[r.TenantOf()].use.add(r.Request.Resources, "NVIDIA H100", 1)
		}
	}
	return ts
}

// withinQuota reports whether t may hold res more: within its nominal on
// every limited dimension, or its cohort as a whole within its members'.
func withinQuota(ts map[string]*tenantState, t *tenantState, res schemas.Resources) bool {
	for _, d := range demands(t.pol.Quota, res, "NVIDIA H100") {
		lim, _ := limit(t.pol.Quota, d.dim, d.key)
		if t.use.value(d.dim, d.key)+d.need <= lim {
			continue
		}
		if t.pol.Cohort == "" {
			return false
		}
		var nominal, used int64
		for _, m := range ts {
			if l, ok := limit(m.pol.Quota, d.dim, d.key); ok && m.pol.Cohort == t.pol.Cohort {
				nominal, used = nominal+l, used+m.use.value(d.dim, d.key)
			}
		}
		if used+d.need > nominal {
			return false
		}
	}
	return true
}

// checkedPass plans and applies a pass, checking each action as it is
// applied, lets some victims stop, and checks the waiting Runs once the
// passes after settle.
func (s *sim) checkedPass(rt *rapid.T) {
	s.checkedPlan(rt)
	// Victims stop in their own time; some do now.
	for _, r := range s.sorted() {
		if r.Stopping != "" && rapid.Bool().Draw(rt, "victim ends") {
			s.end(r.ID)
		}
	}
	s.noStarvation(rt)
}

// checkedPlan plans and applies a pass, checking each action as it is
// applied.
func (s *sim) checkedPlan(rt *rapid.T) Result {
	s.startQueued()
	res := s.planOnly()
	for _, a := range res.Actions {
		switch a.Kind {
		case KindPlace:
			ts := s.usageNow()
			if !withinQuota(ts, ts[a.Run.TenantOf()], a.Run.Request.Resources) {
				rt.Fatalf("placing %s takes tenant %s past its quota with no cohort to lend", a.Run.ID, a.Run.TenantOf())
			}
		case KindPreempt:
			by, _ := s.pol.Class(a.Run.Request.Priority)
			for _, v := range a.Victims {
				vc, ok := s.pol.Class(v.Run.Request.Priority)
				if !ok {
					vc = schemas.PriorityClass{}
				}
				if !v.Run.Request.Preemptible || v.Run.Stopping != "" || (v.Why == "priority" && (!by.Preempts || vc.Value >= by.Value)) {
					rt.Fatalf("%s preempts %s (%s): preemptible %v, stopping %q, class %d vs %d", a.Run.ID, v.RunID, v.Why, v.Run.Request.Preemptible, v.Run.Stopping, vc.Value, by.Value)
				}
			}
		}
		s.apply(a)
	}
	return res
}

// noStarvation fails when a waiting Run within its tenant's quota (its
// preemptors waiting for their victims counted in) fits a node that is
// free of queues and not held for a preemptor whose victims still stop,
// with room and cards for it now, once passes with nothing else happening
// have settled (a preemptor that gives up the place it held frees it for
// the Runs after it only in the next pass).
func (s *sim) noStarvation(rt *rapid.T) {
	for range 4 {
		if res := s.checkedPlan(rt); len(res.Actions) == 0 {
			break
		}
	}
	f := s.fleet()
	ts := s.usageNow()
	held := map[string]bool{} // nodes held for a preemptor whose victims still stop
	for _, r := range s.runs {
		if node, ok := claimedNode(r); ok && r.Phase == schemas.PhaseAccepted {
			held[node] = true
			// The pass that chose its victims held its demand against
			// its tenant's quota: the tenant's other Runs may wait on it.
			ts[r.TenantOf()].use.add(r.Request.Resources, "NVIDIA H100", 1)
		}
	}
	for _, r := range s.sorted() {
		if r.Phase != schemas.PhaseAccepted || !withinQuota(ts, ts[r.TenantOf()], r.Request.Resources) {
			continue
		}
		for _, n := range f.Nodes {
			free := n.Record.Capacity
			for _, b := range n.Running {
				free = free.Sub(b.Resources)
			}
			if _, _, cards := n.PickGPUs(r.Request.Resources.GPUCount, nil); !held[n.Record.NodeID] && len(n.Queued) == 0 && r.Request.Resources.Fits(free) && cards {
				rt.Fatalf("%s (tenant %s) waits (%q) while %s is free for it", r.ID, r.TenantOf(), r.Waiting, n.Record.NodeID)
			}
		}
	}
}
