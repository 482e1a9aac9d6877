package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/controlplane/queue"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

const image = "registry.example/app@sha256:a172cedcae47474b615c54d510a5d84a8dea3032e958587430b413538be3f333"

// noLeases is a lease sweep with nothing to sweep.
type noLeases struct{}

func (noLeases) SweepLeases(context.Context, time.Time, []*schemas.Run) bool { return false }

// renter answers as it is told and records what it was asked.
type renter struct {
	mu         sync.Mutex
	coming     bool
	renting    string
	err        error
	rentFirst  bool // RentBeforeQueueing's answer
	asked      []string
	queuedWins []string // the winners RentBeforeQueueing was shown
}

func (r *renter) RentFor(_ context.Context, run schemas.Run) (bool, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, run.ID)
	return r.coming, r.renting, r.err
}

func (r *renter) RentBeforeQueueing(_ context.Context, _ schemas.Run, d schemas.BookingDecision) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queuedWins = append(r.queuedWins, d.Winner)
	return r.rentFirst, nil
}

// env is a scheduler over an embedded NATS, its clock moved by hand.
type env struct {
	t     *testing.T
	ctx   context.Context
	now   time.Time
	cache *cache.Cache
	store *runs.Store
	sched *Scheduler
}

func newEnv(t *testing.T, waitForCapacity bool, rent Renter) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	conn := testenv.ProvisionedBus(t, "scheduler-test")
	kv, err := conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC), cache: cache.New()}
	clock := func() time.Time { return e.now }
	e.store = runs.NewStore(kv, conn.JS, e.cache, runs.Config{DecisionCandidates: 16, MaxAttempts: 3, Poke: func() {}, Now: clock}, zap.NewNop())
	e.sched = New(Config{
		Interval: time.Second, Timing: lifecycle.Timing{RedispatchAfter: time.Hour, MaxRuntimeSlack: time.Minute},
		Placement: placement.DefaultConfig(), WaitForCapacity: waitForCapacity, Now: clock,
	}, e.cache, e.store, dispatch.New(conn.JS, e.cache, clock, zap.NewNop()), noLeases{}, rent, zap.NewNop())
	return e
}

// node enrolls a ready node offering cpu millicores, holding the test
// image: a Run placed there starts at once.
func (e *env) node(id string, cpu int64) {
	e.cache.NoteNode(schemas.NodeRecord{NodeID: id, State: schemas.NodeReady, FencingToken: 1, Generation: 1,
		Capacity: schemas.Resources{CPUMillis: cpu, MemoryBytes: 1 << 30}, LeaseExpires: e.now.Add(time.Hour),
		Facts: &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: "amd64"}, Images: []schemas.ImageLocality{hotImage()}}, FactsReceivedAt: e.now}, 1)
}

// hotImage is the test image as a node that holds all of it reports it.
func hotImage() schemas.ImageLocality {
	ref, _ := schemas.ParseImageRef("image", image)
	return schemas.ImageLocality{ManifestDigest: ref.Digest, State: schemas.LocalityHot, ContentPresent: true,
		Platform: schemas.Platform{OS: "linux", Architecture: "amd64"}, LayerDigests: []string{ref.Digest}, LayerSizes: []int64{1 << 20}}
}

// submit creates a Run asking for cpu millicores, created at the clock's
// time plus age ago.
func (e *env) submit(requestID string, cpu int64, age time.Duration) schemas.Run {
	e.t.Helper()
	now := e.now
	e.now = now.Add(-age)
	defer func() { e.now = now }()
	r, _, err := e.store.Create(e.ctx, schemas.DefaultTenant, bus.OperatorUser, schemas.RunRequest{RequestID: requestID, Image: image, Resources: schemas.Resources{CPUMillis: cpu}},
		nil, runs.Policy{}, func(schemas.Run) lifecycle.Transition { return nil })
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

func (e *env) run(id string) schemas.Run {
	e.t.Helper()
	r, found, err := e.store.Stored(e.ctx, id)
	if err != nil || !found {
		e.t.Fatalf("run %s: found %v, %v", id, found, err)
	}
	return r
}

// pass runs one scheduling pass, deciding every waiting Run afresh.
func (e *env) pass() { e.sched.pass(e.ctx, queue.NewMemo()) }

// A pass takes Runs oldest first, whatever order they came in: on a node
// with room for one, the oldest starts and the rest queue behind it, and
// when it ends the next oldest starts from the queue.
func TestPassTakesRunsOldestFirst(t *testing.T) {
	e := newEnv(t, false, nil)
	e.node("n1", 1000)
	// Submitted youngest first.
	var ids []string
	for i, name := range []string{"fifth", "fourth", "third", "second", "first"} {
		ids = append([]string{e.submit(name, 1000, time.Duration(i)*time.Second).ID}, ids...)
	}
	e.pass()
	for i, id := range ids {
		r := e.run(id)
		if r.Phase != schemas.PhasePlaced || r.NodeID != "n1" || r.Queued != (i > 0) {
			t.Fatalf("Run %d by age: %s on %q, queued %v; want only the oldest started", i, r.Phase, r.NodeID, r.Queued)
		}
	}
	oldest := e.run(ids[0])
	zero := 0
	if _, err := e.store.Advance(e.ctx, oldest.ID, lifecycle.Report{NodeID: "n1", Workload: schemas.WorkloadObservation{
		RunID: oldest.ID, AttemptID: oldest.AttemptID, Phase: schemas.WorkloadExited, ExitCode: &zero, ObservedAt: e.now}}, false); err != nil {
		t.Fatal(err)
	}
	e.pass()
	for i, id := range ids[1:] {
		if r := e.run(id); r.Queued != (i > 0) {
			t.Errorf("after the oldest ended, Run %d by age is queued %v; want only the next oldest started", i+1, r.Queued)
		}
	}
}

// A Run no node takes now waits, its answer recorded once; one no node
// could ever run fails at once unless the scheduler waits for capacity.
func TestPassWaitsOrFails(t *testing.T) {
	for _, tc := range []struct {
		name            string
		waitForCapacity bool
		lapsed          bool // n1's lease lapsed: a reason waiting may change
		cpu             int64
		phase           schemas.Phase
		waiting         string
	}{
		{"too big for every node", false, false, 4000, schemas.PhaseFailed, "n1=insufficient_cpu;"},
		{"too big, waiting for capacity", true, false, 4000, schemas.PhaseAccepted, "n1=insufficient_cpu;"},
		{"the only node lapsed", false, true, 500, schemas.PhaseAccepted, "n1=lease_stale;"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.waitForCapacity, nil)
			e.node("n1", 1000)
			if tc.lapsed {
				e.now = e.now.Add(2 * time.Hour)
			}
			r := e.submit("r", tc.cpu, 0)
			e.pass()
			got := e.run(r.ID)
			if got.Phase != tc.phase || got.Waiting != tc.waiting {
				t.Fatalf("phase %s waiting %q; want %s, %q", got.Phase, got.Waiting, tc.phase, tc.waiting)
			}
			if tc.phase == schemas.PhaseFailed && got.Reason != string(schemas.CodeUnsatisfiable) {
				t.Errorf("failed for %q, want unsatisfiable", got.Reason)
			}
			if last := got.Outbox[0]; tc.phase == schemas.PhaseAccepted && (last.Code != schemas.CodeNoCapacity || last.Message != "no node fits now; waiting") {
				t.Errorf("the wait's event: %s %q", last.Code, last.Message)
			}
			e.pass()
			if again := e.run(r.ID); again.EventSeq != got.EventSeq {
				t.Errorf("the same answer was recorded again: events %d → %d", got.EventSeq, again.EventSeq)
			}
		})
	}
}

// With a capacity provider, a Run no node takes waits for what is renting
// for it, even one no node could ever run; a provider that fails keeps it
// waiting too, for the next pass to ask again.
func TestPassWaitsForRentals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		renter  *renter
		waiting string
		message string
	}{
		{"a rental on its way", &renter{coming: true, renting: "rental rt-1 is requested"},
			"n1=insufficient_cpu; rental rt-1 is requested", "no node fits now; waiting for capacity: rental rt-1 is requested"},
		{"the provider fails", &renter{err: errors.New("provider down")}, "n1=insufficient_cpu;", "no node fits now; waiting"},
		{"the provider refuses for the tenant's budget", &renter{err: fmt.Errorf("renting: %w", &schemas.Refusal{Code: schemas.CodeBudget, Field: "tenant",
			Reason: "tenant default spent 499.00 of its 500.00 USD budget for day 2026-01-01; a rental would cost 4.00"})},
			"budget: no rental for tenant default", "no node fits now, and no rental: tenant default spent 499.00 of its 500.00 USD budget for day 2026-01-01; a rental would cost 4.00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, false, tc.renter)
			e.node("n1", 1000)
			r := e.submit("big", 4000, 0)
			e.pass()
			got := e.run(r.ID)
			if got.Phase != schemas.PhaseAccepted || got.Waiting != tc.waiting || got.Outbox[0].Message != tc.message {
				t.Fatalf("phase %s, waiting %q, message %q; want accepted, %q, %q", got.Phase, got.Waiting, got.Outbox[0].Message, tc.waiting, tc.message)
			}
			if len(tc.renter.asked) != 1 || tc.renter.asked[0] != r.ID {
				t.Errorf("the renter was asked for %v", tc.renter.asked)
			}
		})
	}
}

// When every node that fits is busy, the renter decides between renting
// and the queue: a Run it rents for is not booked.
func TestPassRentsBeforeQueueing(t *testing.T) {
	for _, rentFirst := range []bool{true, false} {
		rt := &renter{rentFirst: rentFirst}
		e := newEnv(t, false, rt)
		e.node("n1", 1000)
		older, younger := e.submit("older", 1000, time.Second), e.submit("younger", 1000, 0)
		e.pass()
		if r := e.run(older.ID); r.Phase != schemas.PhasePlaced || r.Queued {
			t.Fatalf("the older Run on a free node: %s, queued %v", r.Phase, r.Queued)
		}
		if len(rt.queuedWins) != 1 || rt.queuedWins[0] != "n1" {
			t.Fatalf("RentBeforeQueueing was shown winners %v, want [n1]", rt.queuedWins)
		}
		r := e.run(younger.ID)
		if rentFirst && (r.Phase != schemas.PhaseAccepted || r.NodeID != "") {
			t.Errorf("a Run the renter rents for was booked: %s on %q", r.Phase, r.NodeID)
		}
		if !rentFirst && (r.Phase != schemas.PhasePlaced || !r.Queued) {
			t.Errorf("a Run the renter did not rent for: %s, queued %v; want queued on n1", r.Phase, r.Queued)
		}
	}
}

// Intake decides only the certain "no node fits now": a fleet where a
// node may win, a Run that could fail, or a capacity provider leave the
// Run to the scheduler.
func TestAtIntake(t *testing.T) {
	big := schemas.Run{ID: "r-big", Request: schemas.RunRequest{Image: image, Resources: schemas.Resources{CPUMillis: 4000}}}
	small := schemas.Run{ID: "r-small", Request: schemas.RunRequest{Image: image, Resources: schemas.Resources{CPUMillis: 500}}}
	for _, tc := range []struct {
		name            string
		waitForCapacity bool
		nodes           bool
		rent            Renter
		run             schemas.Run
		summary         string // "": the scheduler's to decide
	}{
		{"no nodes", false, false, nil, small, "no nodes enrolled"},
		{"a node may win", false, true, nil, small, ""},
		{"no node could ever", false, true, nil, big, ""},
		{"no node could ever, waiting for capacity", true, true, nil, big, "n1=insufficient_cpu;"},
		{"with a capacity provider", false, false, &renter{}, small, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.waitForCapacity, tc.rent)
			if tc.nodes {
				e.node("n1", 1000)
			}
			decided := e.sched.Stats().DecidedAtIntake.Load()
			tr := e.sched.AtIntake(tc.run)
			if tc.summary == "" {
				if tr != nil {
					t.Fatalf("intake decided %+v", tr)
				}
				return
			}
			w, ok := tr.(lifecycle.Wait)
			if !ok || w.Summary != tc.summary || w.Code != schemas.CodeNoCapacity || !strings.HasPrefix(w.Message, "no node fits now") {
				t.Fatalf("intake decided %+v, want a wait %q", tr, tc.summary)
			}
			if e.sched.Stats().DecidedAtIntake.Load() != decided+1 {
				t.Error("the early decision was not counted")
			}
		})
	}
}

// A tenant at its quota has its next Run wait on the quota, named in the
// Run and its event, however many passes see it; the Run it waits behind
// is placed.
func TestPassQuotaWait(t *testing.T) {
	e := newEnv(t, false, nil)
	one := int64(1)
	e.sched.cfg.Policy = policy.Static(schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{
		schemas.DefaultTenant: {Quota: &schemas.Quota{Runs: &one}}}}, "v1")
	e.node("n1", 4000)
	first, second := e.submit("first", 1000, time.Second), e.submit("second", 1000, 0)
	e.pass()
	if r := e.run(first.ID); r.Phase != schemas.PhasePlaced {
		t.Fatalf("the first Run: %s", r.Phase)
	}
	r := e.run(second.ID)
	if r.Phase != schemas.PhaseAccepted || r.Waiting != "quota: runs 1 of 1" || r.Outbox[0].Code != schemas.CodeQuota ||
		!strings.HasPrefix(r.Outbox[0].Message, "tenant "+schemas.DefaultTenant+" is at its quota: 1 of 1 Runs") {
		t.Fatalf("the second Run: %s, waiting %q, event %s %q", r.Phase, r.Waiting, r.Outbox[0].Code, r.Outbox[0].Message)
	}
	e.pass()
	if again := e.run(second.ID); again.EventSeq != r.EventSeq {
		t.Errorf("the same quota wait was recorded again: events %d → %d", r.EventSeq, again.EventSeq)
	}
	if tr := e.sched.AtIntake(schemas.Run{ID: "r-new", Request: schemas.RunRequest{Image: image, Resources: schemas.Resources{CPUMillis: 8000}}}); tr != nil {
		t.Errorf("intake decided %+v under a policy with quotas", tr)
	}
}

// budgets reports every tenant past its budget while over is set.
type budgets struct{ over bool }

func (b *budgets) Over(string, time.Time) (bool, string) {
	return b.over, "spent 512.40 of its 500.00 USD budget for day 2026-01-01"
}

func (b *budgets) Stops(string, time.Time) (bool, string) {
	return b.over, "spent 512.40 of its 500.00 USD budget for day 2026-01-01, which stops its running Runs"
}

// A budget that stops running Runs stops them once the tenant is past it,
// in a pass with no Run waiting.
func TestPassBudgetStopsWithNoneWaiting(t *testing.T) {
	e := newEnv(t, false, nil)
	b := &budgets{}
	e.sched.cfg.Budgets = b
	e.sched.cfg.Policy = policy.Static(schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{
		schemas.DefaultTenant: {Budget: &schemas.Budget{AmountUSD: 500, Period: "day", StopRunning: true}}}}, "v1")
	e.node("n1", 4000)
	r := e.submit("spender", 1000, 0)
	e.pass()
	if got := e.run(r.ID); got.Phase != schemas.PhasePlaced || got.Stopping != "" {
		t.Fatalf("within budget: %s, stopping %q", got.Phase, got.Stopping)
	}
	b.over = true
	e.pass()
	if got := e.run(r.ID); got.Stopping != schemas.CodeBudgetExceeded {
		t.Fatalf("past its budget, with no Run waiting: %s, stopping %q; want stopping %s", got.Phase, got.Stopping, schemas.CodeBudgetExceeded)
	}
}
