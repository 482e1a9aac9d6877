package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// gpuUUIDs are n fake card UUIDs for node.
func gpuUUIDs(node byte, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("GPU-%02x0a0000-0000-0000-0000-%012d", node, i+1)
	}
	return out
}

// gpuRun is a one-card Run of the no-op image.
func gpuRun(requestID string, env map[string]string) schemas.RunRequest {
	r := noopRun(requestID, env)
	r.Resources = schemas.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, GPUCount: 1}
	return r
}

func quota(gpus int64) *schemas.Quota { return &schemas.Quota{GPUs: map[string]int64{"*": gpus}} }

// TestAcceptance_QuotaAndBudget: a tenant at its GPU quota has its next Run
// wait with wait code quota (as `run get` shows) while cards are free,
// until one of its Runs ends; a borrower's preemptible Run, running on
// quota its cohort's lender does not use, is preempted when the lender
// needs it back and no card is free; a tenant past its budget gets no
// rental and its Runs wait with wait code budget, while another tenant's
// same Run rents.
func TestAcceptance_QuotaAndBudget(t *testing.T) {
	t.Run("quota", testQuotaWait)
	t.Run("cohort_reclaim", testCohortReclaim)
	t.Run("budget", testBudgetWait)
}

func testQuotaWait(t *testing.T) {
	pol := schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{"capped": {Quota: quota(2)}}}
	f := newFleet(t, withPolicy(t, pol, "capped"))
	f.startNoopNode(noopNodeSpec{id: "quota-gpu", slots: 4, gpus: gpuUUIDs(1, 4)})
	bin := testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet")

	first := f.submitAs("capped", gpuRun("cap-1", exitAfter(8*time.Second)))
	second := f.submitAs("capped", gpuRun("cap-2", nil))
	f.waitPhase(first, schemas.PhaseRunning, 30*time.Second)
	f.waitPhase(second, schemas.PhaseRunning, 30*time.Second)
	third := f.submitAs("capped", gpuRun("cap-3", exitAfter(500*time.Millisecond)))
	r := f.waitRun(third, "waiting on its quota", 20*time.Second, func(r schemas.Run) bool {
		return r.WaitCode == schemas.CodeQuota || r.NodeID != ""
	})
	if r.WaitCode != schemas.CodeQuota || r.NodeID != "" {
		t.Fatalf("the third Run is %s on %q with wait code %q while its tenant holds 2 of its 2 GPUs; want it waiting on quota", r.Phase, r.NodeID, r.WaitCode)
	}
	if rec := f.nodeRecord("quota-gpu"); rec.Capacity.GPUCount != 4 {
		t.Fatalf("the node offers %d cards, want 4 (2 free)", rec.Capacity.GPUCount)
	}
	// `run get` shows the wait code and why.
	out, err := f.cli(bin)("run", "get", "-o", "json", third).Output()
	var shown schemas.Run
	if err != nil || json.Unmarshal(out, &shown) != nil || shown.WaitCode != schemas.CodeQuota {
		t.Errorf("run get -o json: %v, wait code %q\n%s", err, shown.WaitCode, out)
	}
	if out, err := f.cli(bin)("run", "get", third).CombinedOutput(); err != nil || !strings.Contains(string(out), "quota") {
		t.Errorf("run get shows no quota wait: %v\n%s", err, out)
	}
	var waitEv *schemas.RunEvent
	for _, ev := range f.events(third) {
		if ev.Decided() && ev.Code == schemas.CodeQuota {
			waitEv = &ev
		}
	}
	if waitEv == nil || !strings.Contains(waitEv.Message, "capped") || !strings.Contains(waitEv.Message, "2 of 2") {
		t.Errorf("no wait event naming the tenant and its 2 of 2 GPUs: %+v", waitEv)
	}
	// Once the first ends, the third runs.
	done := f.waitPhase(first, schemas.PhaseSucceeded, 30*time.Second)
	ran := f.waitPhase(third, schemas.PhaseSucceeded, 30*time.Second)
	if ran.StartedAt == nil || done.FinishedAt == nil || ran.StartedAt.Before(*done.FinishedAt) {
		t.Errorf("the third Run started at %v, before the first ended at %v", ran.StartedAt, done.FinishedAt)
	}
	if r, _ := f.run(second); r.Phase != schemas.PhaseRunning {
		t.Errorf("the second Run is %s, want still running", r.Phase)
	}
}

func testCohortReclaim(t *testing.T) {
	pol := schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{
		"lend": {Cohort: "lab", Quota: quota(2)}, "borrow": {Cohort: "lab", Quota: quota(2)},
	}}
	f := newFleet(t, withPolicy(t, pol, "lend", "borrow"))
	f.startNoopNode(noopNodeSpec{id: "cohort-gpu", slots: 4, gpus: gpuUUIDs(2, 4)})

	// borrow fills its own quota with Runs that may not be preempted, then
	// borrows lend's two unused cards for two preemptible ones.
	var own, borrowed []schemas.Run
	for i := range 2 {
		own = append(own, f.waitPhase(f.submitAs("borrow", gpuRun(fmt.Sprintf("own-%d", i), nil)), schemas.PhaseRunning, 30*time.Second))
	}
	for i := range 2 {
		req := gpuRun(fmt.Sprintf("borrowed-%d", i), nil)
		req.Preemptible, req.GraceSeconds = true, 1
		borrowed = append(borrowed, f.waitPhase(f.submitAs("borrow", req), schemas.PhaseRunning, 30*time.Second))
	}
	// lend, within its own quota, finds no card free: it takes one back.
	lender := f.submitAs("lend", gpuRun("lender-1", exitAfter(4*time.Second)))
	f.waitPhase(lender, schemas.PhaseRunning, 30*time.Second)
	var victims []schemas.Run
	f.eventually(20*time.Second, "a borrowed Run requeued as preempted", func() bool {
		victims = victims[:0]
		for _, b := range borrowed {
			if r, _ := f.run(b.ID); r.Preemptions > 0 {
				victims = append(victims, r)
			}
		}
		return len(victims) > 0
	})
	if len(victims) != 1 {
		t.Fatalf("%d borrowed Runs preempted for one card, want 1", len(victims))
	}
	victim := victims[0]
	if back := requeued(f.events(victim.ID), schemas.CodePreempted); len(back) != 1 {
		t.Errorf("the victim's requeue events: %+v, want one with code preempted", back)
	}
	named := victimsNamed(f.events(lender))
	if len(named) != 1 || named[0].RunID != victim.ID || named[0].Why != "reclaim" || named[0].Tenant != "borrow" {
		t.Errorf("the lender's decision names victims %+v; want %s of borrow, why reclaim", named, victim.ID)
	}
	for _, b := range own {
		after, _ := f.run(b.ID)
		unchanged(t, b, after)
	}
	for _, b := range borrowed {
		if b.ID != victim.ID {
			after, _ := f.run(b.ID)
			unchanged(t, b, after)
		}
	}
	// The lender's Run ends; its quota is lent again and the victim runs.
	f.waitPhase(lender, schemas.PhaseSucceeded, 30*time.Second)
	again := f.waitRun(victim.ID, "running again", 30*time.Second, func(r schemas.Run) bool {
		return r.Phase == schemas.PhaseRunning && r.Attempt > victim.Attempt
	})
	if len(again.Attempts) < 2 || again.Attempts[0].Outcome != schemas.CodePreempted {
		t.Errorf("victim's attempts %+v, want the first preempted", again.Attempts)
	}
}

// budgetPolicy prices an owned card at 3600 USD an hour (a dollar a
// second) and gives tenant spender a one-dollar daily budget. Agents state
// no price of their own, so the owned rate is what makes a short Run spend
// the budget.
var budgetPolicy = schemas.SchedulingPolicy{
	OwnedGPUHourRates: map[string]float64{"*": 3600},
	Tenants:           map[string]schemas.TenantPolicy{"spender": {Budget: &schemas.Budget{AmountUSD: 1, Period: "day"}}},
}

func testBudgetWait(t *testing.T) {
	var (
		f        *fleet
		provider *local.Provider
	)
	f = newFleet(t, withPolicy(t, budgetPolicy, "spender", "payer"), func(c *controlplane.Config) {
		provider = local.New(func(ctx context.Context, name string, boot schemas.NodeBootstrap) (local.Machine, error) {
			return f.noopMachine(name, boot)
		}, capacity.Offer{ID: "local-cpu", CPUMillis: 4 * slotMillis, MemoryBytes: 8 << 30, ReadySeconds: 1,
			PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: 10_000, Exact: true}})
		c.Capacity = &rentals.Config{Provider: provider, OwnershipToken: "wf-e2e", IdleTimeout: time.Minute, Interval: 200 * time.Millisecond}
	})
	f.startNoopNode(noopNodeSpec{id: "budget-gpu", gpus: gpuUUIDs(3, 1)})

	// About 2.5 s on the owned card spends more than the dollar.
	spent := f.waitPhase(f.submitAs("spender", gpuRun("spend-1", exitAfter(2500*time.Millisecond))), schemas.PhaseSucceeded, 30*time.Second)
	if spent.CostUSD < 1 || len(spent.Attempts) != 1 || spent.Attempts[0].PricePerHour != 3600 {
		t.Fatalf("the first Run cost %.2f USD with attempts %+v; want over 1 USD at 3600 USD/h", spent.CostUSD, spent.Attempts)
	}
	// Two slots: the owned node has one, only a rental fits it.
	big := func(id string) schemas.RunRequest {
		r := noopRun(id, exitAfter(200*time.Millisecond))
		r.Resources.CPUMillis = 2 * slotMillis
		return r
	}
	over := f.submitAs("spender", big("spend-2"))
	w := f.waitRun(over, "waiting on its budget", 20*time.Second, func(r schemas.Run) bool {
		return r.WaitCode == schemas.CodeBudget || r.NodeID != ""
	})
	if w.WaitCode != schemas.CodeBudget || w.NodeID != "" {
		t.Fatalf("spender's second Run is %s on %q with wait code %q; want it waiting on its budget", w.Phase, w.NodeID, w.WaitCode)
	}
	time.Sleep(2 * time.Second) // many passes, and rental rounds
	if n := provider.Launched(); n != 0 || len(f.rentals()) != 0 {
		t.Fatalf("%d machines rented (%+v) for a tenant past its budget", n, f.rentals())
	}
	// The same Run of a tenant with no budget rents.
	paid := f.waitPhase(f.submitAs("payer", big("pay-1")), schemas.PhaseSucceeded, 45*time.Second)
	if rs := f.rentals(); len(rs) != 1 || rs[0].ForRun != paid.ID || rs[0].NodeID != paid.NodeID {
		t.Fatalf("rentals %+v; payer's Run ran on %s", rs, paid.NodeID)
	}
	// spender still waits, though the rented node is free and fits it.
	time.Sleep(time.Second)
	if r, _ := f.run(over); r.WaitCode != schemas.CodeBudget || r.NodeID != "" || r.Phase != schemas.PhaseAccepted {
		t.Errorf("spender's Run is %s on %q with wait code %q after a node freed; want it waiting on its budget", r.Phase, r.NodeID, r.WaitCode)
	}
	if n := provider.Launched(); n != 1 {
		t.Errorf("%d machines rented, want payer's one", n)
	}
	var waitEv *schemas.RunEvent
	for _, ev := range f.events(over) {
		if ev.Decided() && ev.Code == schemas.CodeBudget {
			waitEv = &ev
		}
	}
	if waitEv == nil || !strings.Contains(waitEv.Message, "spender") || !strings.Contains(waitEv.Message, "budget") {
		t.Errorf("no wait event naming the tenant and its budget: %+v", waitEv)
	}
}

// noopMachine is a rented "machine": an agent over the no-op runtime that
// enrolls with the bootstrap it was handed.
func (f *fleet) noopMachine(name string, boot schemas.NodeBootstrap) (local.Machine, error) {
	conn, err := bus.Connect(boot.ControlPlaneURL, name, f.log.Named(name))
	if err != nil {
		return nil, err
	}
	a, err := agent.New(agent.Config{NodeID: boot.NodeID, RentalID: boot.RentalID, Generation: boot.Generation, EnrollmentToken: boot.EnrollmentToken,
		DataDir: tempDir(f.t), StopGrace: time.Second, Capacity: schemas.Resources{CPUMillis: 4 * slotMillis, MemoryBytes: 8 << 30}},
		conn, noopruntime.New(noopruntime.Options{Images: []string{noopDigest}}), f.log.Named(name))
	if err != nil {
		conn.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &localMachine{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		defer conn.Close()
		_ = a.Run(ctx)
	}()
	f.t.Cleanup(func() { _ = m.Stop(context.Background()) })
	return m, nil
}
