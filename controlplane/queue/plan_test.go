package queue

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// hold books a Run of tenant on node (running, or in its queue).
func (s *sim) hold(tenant, node string, cpu, gpus int64, queued bool, mod ...func(*schemas.RunRequest)) *schemas.Run {
	r := s.submit(tenant, cpu, gpus, mod...)
	r.Phase, r.NodeID, r.Queued, r.Attempt = schemas.PhaseRunning, node, queued, 1
	if !queued {
		f := s.fleet()
		r.GPUs, _, _ = f.Node(node).PickGPUs(gpus, nil)
	}
	return r
}

func placed(res Result) []string {
	var ids []string
	for _, a := range res.Actions {
		if a.Kind == KindPlace {
			ids = append(ids, a.Run.ID)
		}
	}
	return ids
}

func action(t *testing.T, res Result, id string) Action {
	t.Helper()
	for _, a := range res.Actions {
		if a.Run.ID == id {
			return a
		}
	}
	t.Fatalf("no action for %s in %+v", id, res.Actions)
	return Action{}
}

// A tenant at its GPU quota waits with the quota named; a cohort member's
// unused quota lets it borrow, and only as far as the cohort's nominal.
func TestQuotaAndCohortBorrowing(t *testing.T) {
	quota := func(gpus int64, cohort string) schemas.TenantPolicy {
		return schemas.TenantPolicy{Cohort: cohort, Quota: &schemas.Quota{GPUs: map[string]int64{"*": gpus}}}
	}
	for _, tc := range []struct {
		name   string
		lender schemas.TenantPolicy
		placed int // of acme's four 1-card Runs
	}{
		{"no cohort", quota(4, ""), 2},
		{"a lender with 1 card unused", quota(2, "research"), 3},
		{"a lender with none unused", quota(1, "research"), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{"acme": quota(2, "research"), "beta": tc.lender}})
			s.node("n1", 64000, 8, "NVIDIA H100 80GB HBM3")
			s.hold("beta", "n1", 1000, 1, false)
			var ids []string
			for range 4 {
				ids = append(ids, s.submit("acme", 1000, 1).ID)
			}
			res := s.pass()
			if got := placed(res); len(got) != tc.placed || !slices.Equal(got, ids[:tc.placed]) {
				t.Fatalf("placed %v, want the %d oldest of %v", got, tc.placed, ids)
			}
			w := action(t, res, ids[tc.placed])
			if w.Kind != KindWait || w.Code != schemas.CodeQuota || !strings.HasPrefix(w.Summary, "quota: gpus(*) ") ||
				!strings.Contains(w.Message, "tenant acme is at its quota") {
				t.Errorf("the first Run over quota: %+v", w)
			}
			if again := s.pass(); len(placed(again)) != 0 || len(again.Actions) != 0 {
				t.Errorf("a second pass did %+v", again.Actions)
			}
		})
	}
}

// A quota by model counts the cards of the node a Run lands on: a Run
// asking for any card is held to the H100 quota once an H100 node wins.
func TestQuotaCountsTheWinnersModel(t *testing.T) {
	s := newSim(t, schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{"acme": {Quota: &schemas.Quota{GPUs: map[string]int64{"h100": 1}}}}})
	s.node("n1", 64000, 8, "NVIDIA H100 80GB HBM3")
	a, b := s.submit("acme", 1000, 1), s.submit("acme", 1000, 1)
	res := s.pass()
	if got := placed(res); !slices.Equal(got, []string{a.ID}) {
		t.Fatalf("placed %v, want only %s", got, a.ID)
	}
	if w := action(t, res, b.ID); w.Code != schemas.CodeQuota || w.Summary != "quota: gpus(h100) 1 of 1" {
		t.Errorf("the second Run: %+v", w)
	}
}

// Victims: only preemptible Runs of a strictly lower class, the set losing
// the fewest GPU-seconds, never a Run already stopping again; while they
// stop, the preemptor chooses no new ones.
func TestPreemptionVictims(t *testing.T) {
	pol := schemas.SchedulingPolicy{DefaultPriority: "batch", PriorityClasses: []schemas.PriorityClass{
		{Name: "urgent", Value: 1000, Preempts: true}, {Name: "batch", Value: 0}, {Name: "high", Value: 1000}}}
	s := newSim(t, pol)
	s.node("n1", 64000, 4, "H100")
	s.node("n2", 64000, 4, "H100")
	preemptible := func(r *schemas.RunRequest) { r.Preemptible = true }
	high := func(r *schemas.RunRequest) { r.Priority, r.Preemptible = "high", true }
	s.now = s.now.Add(-time.Hour)
	old := s.hold("a", "n1", 1000, 2, false, preemptible) // 2 cards × 1h
	s.hold("a", "n1", 1000, 2, false)                     // not preemptible
	s.now = s.now.Add(50 * time.Minute)
	young := s.hold("a", "n2", 1000, 2, false, preemptible) // 2 cards × 10 min
	s.hold("a", "n2", 1000, 2, false, high)                 // preemptible, same class
	s.now = s.now.Add(10 * time.Minute)
	// Four queued bookings per node: no node can queue it either.
	for _, n := range []string{"n1", "n2"} {
		for range 4 {
			s.hold("a", n, 1000, 0, true)
		}
	}
	u := s.submit("b", 1000, 2, func(r *schemas.RunRequest) { r.Priority = "urgent" })
	res := s.pass()
	a := action(t, res, u.ID)
	if a.Kind != KindPreempt || len(a.Victims) != 1 || a.Victims[0].RunID != young.ID || a.Victims[0].Why != "priority" ||
		len(a.Decision.Victims) != 1 || a.Decision.Victims[0].GPUSeconds != 1200 {
		t.Fatalf("preemption %+v, want %s alone (1200 GPU-seconds, priority)", a, young.ID)
	}
	if res := s.pass(); res.Decisions > 1 || slices.ContainsFunc(res.Actions, func(a Action) bool { return a.Kind == KindPreempt }) {
		t.Fatalf("while its victim stops, a second pass did %+v", res.Actions)
	}
	if r := s.runs[u.ID]; r.WaitCode != schemas.CodePreempting {
		t.Errorf("the preemptor waits %q", r.WaitCode)
	}
	if s.runs[old.ID].Stopping != "" {
		t.Error("a second victim was chosen")
	}
	// A second urgent Run finds only the older preemptible one.
	u2 := s.submit("b", 1000, 2, func(r *schemas.RunRequest) { r.Priority = "urgent" })
	if a := action(t, s.pass(), u2.ID); a.Kind != KindPreempt || a.Victims[0].RunID != old.ID {
		t.Fatalf("the second preemptor: %+v", a)
	}
	// Nothing else on either node may be taken: a third waits.
	u3 := s.submit("b", 1000, 2, func(r *schemas.RunRequest) { r.Priority = "urgent" })
	if a := action(t, s.pass(), u3.ID); a.Kind != KindWait || a.Code != schemas.CodeNoCapacity {
		t.Fatalf("the third preemptor: %+v", a)
	}
}

// Victims are chosen only on a node whose cards keep the preemptor's
// tenant within quota: on an H100 node a tenant at its H100 quota would
// only wait on the quota once they stopped.
func TestPreemptionKeepsToQuotaOfVictimsNode(t *testing.T) {
	s := newSim(t, schemas.SchedulingPolicy{DefaultPriority: "low", PriorityClasses: []schemas.PriorityClass{
		{Name: "urgent", Value: 10, Preempts: true}, {Name: "low", Value: 0}},
		Tenants: map[string]schemas.TenantPolicy{"acme": {Quota: &schemas.Quota{GPUs: map[string]int64{"h100": 1}}}}})
	s.node("h", 64000, 2, "NVIDIA H100")
	s.node("a", 64000, 1, "NVIDIA A100")
	preemptible := func(r *schemas.RunRequest) { r.Preemptible = true }
	s.now = s.now.Add(-time.Hour)
	older := s.hold("x", "a", 1000, 1, false, preemptible) // 1 card × 1h
	s.now = s.now.Add(50 * time.Minute)
	s.hold("acme", "h", 1000, 1, false)                      // acme's one H100
	cheaper := s.hold("x", "h", 1000, 1, false, preemptible) // 1 card × 10 min
	s.now = s.now.Add(10 * time.Minute)
	for _, n := range []string{"h", "a"} {
		for range 4 {
			s.hold("x", n, 1000, 1, true) // a full queue: no node can queue it either
		}
	}
	u := s.submit("acme", 1000, 1, func(r *schemas.RunRequest) { r.Priority = "urgent" })
	a := action(t, s.pass(), u.ID)
	if a.Kind != KindPreempt || len(a.Victims) != 1 || a.Victims[0].RunID != older.ID {
		t.Fatalf("preemption %+v, want %s on the A100 node, not %s on the H100 one", a, older.ID, cheaper.ID)
	}
}

// A preemptor's demand counts against its tenant's quota for the rest of
// the pass: of two preemptors with room for one, only the first stops
// victims; the other waits on the quota.
func TestPreemptorsShareTheirQuota(t *testing.T) {
	s := newSim(t, schemas.SchedulingPolicy{DefaultPriority: "low", PriorityClasses: []schemas.PriorityClass{
		{Name: "urgent", Value: 10, Preempts: true}, {Name: "low", Value: 0}},
		Tenants: map[string]schemas.TenantPolicy{"acme": {Quota: &schemas.Quota{GPUs: map[string]int64{"*": 1}}}}})
	s.node("n1", 64000, 2, "NVIDIA H100")
	preemptible := func(r *schemas.RunRequest) { r.Preemptible = true }
	s.hold("x", "n1", 1000, 1, false, preemptible)
	s.hold("x", "n1", 1000, 1, false, preemptible)
	for range 4 {
		s.hold("x", "n1", 1000, 1, true) // a full queue: no node can queue it either
	}
	urgent := func(r *schemas.RunRequest) { r.Priority = "urgent" }
	u1, u2 := s.submit("acme", 1000, 1, urgent), s.submit("acme", 1000, 1, urgent)
	res := s.pass()
	if a := action(t, res, u1.ID); a.Kind != KindPreempt || len(a.Victims) != 1 {
		t.Fatalf("the first preemptor: %+v", a)
	}
	if a := action(t, res, u2.ID); a.Kind != KindWait || a.Code != schemas.CodeQuota {
		t.Fatalf("the second preemptor, past acme's quota beside the first: %+v", a)
	}
}

// A lender within its nominal reclaims from a cohort borrower over its
// own: the borrower's preemptible Run is the victim, whatever its class.
func TestReclaimFromBorrower(t *testing.T) {
	q := func(gpus int64) schemas.TenantPolicy {
		return schemas.TenantPolicy{Cohort: "research", Quota: &schemas.Quota{GPUs: map[string]int64{"*": gpus}}}
	}
	s := newSim(t, schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{"lender": q(2), "borrower": q(2)}})
	s.node("n1", 64000, 4, "H100")
	preemptible := func(r *schemas.RunRequest) { r.Preemptible = true }
	s.hold("borrower", "n1", 1000, 2, false)
	borrowed := s.hold("borrower", "n1", 1000, 2, false, preemptible)
	for range 4 {
		s.hold("borrower", "n1", 1000, 0, true)
	}
	l := s.submit("lender", 1000, 2)
	a := action(t, s.pass(), l.ID)
	if a.Kind != KindPreempt || len(a.Victims) != 1 || a.Victims[0].RunID != borrowed.ID || a.Victims[0].Why != "reclaim" {
		t.Fatalf("reclaim: %+v", a)
	}
}

// Reclaim stops no more than a borrower borrows: a borrower over its
// nominal by one card loses one Run, whether a second reclaimer comes in
// the same pass or one reclaimer needs more.
func TestReclaimTakesOnlyWhatIsBorrowed(t *testing.T) {
	q := func(gpus int64) schemas.TenantPolicy {
		return schemas.TenantPolicy{Cohort: "research", Quota: &schemas.Quota{GPUs: map[string]int64{"*": gpus}}}
	}
	for _, tc := range []struct {
		name    string
		demands []int64 // the lender's Runs, in cards
	}{
		{"two reclaimers of a card each", []int64{1, 1}},
		{"one reclaimer of two cards", []int64{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{"lender": q(2), "borrower": q(2)}})
			s.node("n1", 64000, 3, "H100")
			preemptible := func(r *schemas.RunRequest) { r.Preemptible = true }
			for range 3 {
				s.hold("borrower", "n1", 1000, 1, false, preemptible) // one card over its 2
			}
			for range 4 {
				s.hold("x", "n1", 1000, 1, true) // a full queue: no node can queue it either
			}
			for _, g := range tc.demands {
				s.submit("lender", 1000, g)
			}
			victims := 0
			for _, a := range s.pass().Actions {
				victims += len(a.Victims)
			}
			if victims > 1 {
				t.Fatalf("%d of the borrower's Runs stopped; it borrowed one card", victims)
			}
		})
	}
}

// A tenant past its budget waits on it; one whose budget stops running
// Runs has them stopped, queued ones too.
func TestBudget(t *testing.T) {
	s := newSim(t, schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{
		"acme": {Budget: &schemas.Budget{AmountUSD: 500, Period: "day", StopRunning: true}}, "beta": {}}})
	s.budget = func(tenant string) (bool, string) {
		return tenant == "acme", "spent 512.40 of its 500.00 USD budget for day 2026-12-07"
	}
	s.node("n1", 64000, 0, "")
	running := s.hold("acme", "n1", 1000, 0, false)
	s.node("n2", 1000, 0, "")
	s.hold("beta", "n2", 1000, 0, false)
	queued := s.hold("acme", "n2", 1000, 0, true) // behind beta's Run: it stays queued
	w, b := s.submit("acme", 1000, 0), s.submit("beta", 1000, 0)
	res := s.pass()
	if a := action(t, res, running.ID); a.Kind != KindBudgetStop {
		t.Errorf("the running Run: %+v", a)
	}
	if a := action(t, res, queued.ID); a.Kind != KindBudgetStop {
		t.Errorf("the queued Run: %+v", a)
	}
	if a := action(t, res, w.ID); a.Kind != KindWait || a.Code != schemas.CodeBudget || !strings.Contains(a.Message, "spent 512.40") {
		t.Errorf("the waiting Run: %+v", a)
	}
	if !slices.Equal(placed(res), []string{b.ID}) {
		t.Errorf("placed %v, want beta's Run", placed(res))
	}
}

// On a node whose queue leaves no room for a preemptor beside it, the
// preemptor makes room for itself: the queue's head takes the place, and
// the preemptor preempts again (room for the rest of the queue and itself,
// now that there can be) and starts once the queue has drained, at the
// price of at most one Run more than the queue holds.
func TestPreemptionThroughAQueue(t *testing.T) {
	s := newSim(t, schemas.SchedulingPolicy{DefaultPriority: "low", PriorityClasses: []schemas.PriorityClass{
		{Name: "urgent", Value: 10, Preempts: true}, {Name: "low", Value: 0}}})
	s.node("n1", 4000, 0, "")
	preemptible := func(r *schemas.RunRequest) { r.Preemptible = true }
	for range 4 {
		s.hold("x", "n1", 1000, 0, false, preemptible)
	}
	for range 4 {
		s.hold("x", "n1", 1000, 0, true, preemptible)
	}
	u := s.submit("y", 1000, 0, func(r *schemas.RunRequest) { r.Priority = "urgent" })
	victims := 0
	for range 8 {
		s.now = s.now.Add(time.Second)
		res := s.pass()
		if s.runs[u.ID].Phase != schemas.PhaseAccepted {
			running := 0
			for _, r := range s.runs {
				if r.NodeID == "n1" && !r.Queued && r.Phase != schemas.PhaseAccepted {
					running++
				}
			}
			if running > 4 {
				t.Errorf("n1 runs %d Runs of 1000m on 4000m", running)
			}
			return
		}
		for _, a := range res.Actions {
			if victims += len(a.Victims); victims > 5 {
				t.Fatalf("%d Runs preempted for one, behind a queue of 4", victims)
			}
		}
		for _, r := range s.sorted() {
			if r.Stopping != "" {
				s.end(r.ID)
			}
		}
	}
	t.Fatalf("the urgent Run still waits: %q", s.runs[u.ID].Waiting)
}
