package usage

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/internal/metrics"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

func TestPeriodStart(t *testing.T) {
	sunday := time.Date(2026, 12, 6, 23, 59, 0, 0, time.UTC)
	monday := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		period string
		at     time.Time
		want   time.Time
		name   string
	}{
		{schemas.BudgetDay, sunday, time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC), "day 2026-12-06"},
		{schemas.BudgetWeek, sunday, time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), "week 2026-11-30"},
		{schemas.BudgetWeek, monday, monday, "week 2026-12-07"},
		{schemas.BudgetMonth, sunday, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), "month 2026-12"},
		// Another zone's clock is read in UTC.
		{schemas.BudgetDay, time.Date(2026, 12, 7, 1, 0, 0, 0, time.FixedZone("x", 3*3600)), time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC), "day 2026-12-06"},
	} {
		got := PeriodStart(tc.period, tc.at)
		if !got.Equal(tc.want) || PeriodName(tc.period, got) != tc.name {
			t.Errorf("%s at %s: %s (%s), want %s (%s)", tc.period, tc.at, got, PeriodName(tc.period, got), tc.want, tc.name)
		}
	}
	// The window holds the week's Monday when it is in the month before.
	if got := WindowStart(time.Date(2026, 12, 3, 5, 0, 0, 0, time.UTC)); !got.Equal(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("window on 2026-12-03 starts %s", got)
	}
	if got := WindowStart(sunday); !got.Equal(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("window on 2026-12-06 starts %s", got)
	}
	if got := WindowStart(time.Date(2026, 12, 20, 0, 0, 0, 0, time.UTC)); !got.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("window on 2026-12-20 starts %s", got)
	}
	if dayOf(time.Unix(-1, 0)) != -1 || dayOf(time.Unix(86400, 0)) != 1 {
		t.Error("dayOf")
	}
}

// runs is the active Runs a test gives the ledger.
type runs struct {
	mu sync.Mutex
	rs []*schemas.Run
}

func (a *runs) ActiveRuns() []*schemas.Run {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rs
}

func publishRecord(t *testing.T, ctx context.Context, js jetstream.JetStream, rec schemas.UsageRecord) {
	t.Helper()
	b, err := codec.Encode(codec.JSON, rec)
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: bus.UsageSubject(rec.Tenant), Data: b, Header: nats.Header{}}
	m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
	if _, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(bus.UsageMsgID(rec.AttemptID))); err != nil {
		t.Fatal(err)
	}
}

func record(tenant, run, model string, usd float64, ended time.Time) schemas.UsageRecord {
	return schemas.UsageRecord{RunID: run, Tenant: tenant, AttemptID: schemas.WorkloadID(run, 1), NodeID: "n1", GPUModel: model, GPUs: 1,
		HeldFrom: ended.Add(-time.Hour), EndedAt: ended, Seconds: 3600, CostUSD: usd, Outcome: "succeeded"}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// The ledger sums WF_USAGE per tenant and period, adds the current
// attempts' cost so far, and answers the scheduler's and the rental
// policy's budget questions with the figures in their messages; records
// stored twice under one id count once, and records that arrive later
// count as they come.
func TestLedgerBudgets(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "usage-test")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC) // a Monday
	pol := policy.Static(schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{
		"acme":  {Budget: &schemas.Budget{AmountUSD: 500, Period: schemas.BudgetDay}},
		"beta":  {Budget: &schemas.Budget{AmountUSD: 100, Period: schemas.BudgetWeek}},
		"delta": {Budget: &schemas.Budget{AmountUSD: 10, Period: schemas.BudgetDay, StopRunning: true}},
	}}, "v1")
	active := &runs{}
	l := NewLedger(conn.JS, pol, active, func() time.Time { return now }, zaptest.NewLogger(t))

	publishRecord(t, ctx, conn.JS, record("acme", "r-a1", "H100", 300, now.Add(-time.Hour)))
	publishRecord(t, ctx, conn.JS, record("acme", "r-a1", "H100", 300, now.Add(-time.Hour))) // a republished outbox
	publishRecord(t, ctx, conn.JS, record("acme", "r-a2", "A100", 1000, now.Add(-13*time.Hour)))
	publishRecord(t, ctx, conn.JS, record("beta", "r-b1", "", 60, now.Add(-13*time.Hour)))
	publishRecord(t, ctx, conn.JS, record("gamma", "r-c1", "H100", 5000, now.Add(-time.Hour)))
	publishRecord(t, ctx, conn.JS, record("delta", "r-d1", "", 50, now.Add(-time.Hour)))

	// Before the ledger has read the stream a budgeted tenant waits; one
	// without a budget never does.
	if over, why := l.Over("acme", now); !over || !strings.Contains(why, "still reading WF_USAGE") {
		t.Fatalf("unread ledger: over %v %q", over, why)
	}
	// Nor is a running Run stopped on a spend not read yet.
	if stops, why := l.Stops("delta", now); stops {
		t.Fatalf("unread ledger stops delta's running Runs: %s", why)
	}
	if ok, _ := l.Allows("gamma", 1e6, now); !ok {
		t.Fatal("a tenant without a budget was refused")
	}
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Run(lctx) }()
	defer func() { stop(); <-done }()
	waitUntil(t, "the ledger to read WF_USAGE", func() bool { over, _ := l.Over("beta", now); return !over })

	if got := l.Spent("acme", PeriodStart(schemas.BudgetDay, now)); got != 300 {
		t.Errorf("acme spent %.2f today, want 300 (the same record twice counts once; yesterday's is not today's)", got)
	}
	if got := l.Spent("beta", PeriodStart(schemas.BudgetWeek, now)); got != 0 {
		t.Errorf("beta spent %.2f this week, want 0: its record ended on Sunday", got)
	}
	if over, why := l.Over("acme", now); over {
		t.Errorf("acme at 300 of 500 is over: %s", why)
	}
	if stops, why := l.Stops("delta", now); !stops || !strings.Contains(why, "spent 50.00 of its 10.00 USD") {
		t.Errorf("delta past a stop_running budget: stops %v %q", stops, why)
	}
	// A running attempt of acme's, held 2.5 hours at 100/h, makes 550.
	later := now.Add(2 * time.Second) // past the accrual's memo
	held := later.Add(-150 * time.Minute)
	active.mu.Lock()
	active.rs = []*schemas.Run{
		{ID: "r-a3", Tenant: "acme", Phase: schemas.PhaseRunning, Attempt: 1,
			Attempts: []schemas.AttemptRecord{{Attempt: 1, NodeID: "n1", GPUModel: "H100", PricePerHour: 100, HeldFrom: &held}}},
		{ID: "r-a4", Tenant: "acme", Phase: schemas.PhaseAccepted, WaitCode: schemas.CodeBudget},
		{ID: "r-a5", Tenant: "acme", Phase: schemas.PhaseAccepted, WaitCode: schemas.CodeBudget},
		{ID: "r-b2", Tenant: "beta", Phase: schemas.PhasePlaced, Queued: true},
	}
	active.mu.Unlock()
	want := "tenant acme spent 550.00 of its 500.00 USD budget for day 2026-12-07; waits for the next period"
	if over, why := l.Over("acme", later); !over || why != want {
		t.Errorf("acme with a running attempt: over %v %q, want %q", over, why, want)
	}
	// The rental policy: beta at 0 of 100 this week may rent 100, not 100.01.
	if ok, why := l.Allows("beta", 100, later); !ok {
		t.Errorf("beta refused a rental within its budget: %s", why)
	}
	ok, why := l.Allows("beta", 100.01, later)
	if wantWhy := "tenant beta spent 0.00 of its 100.00 USD budget for week 2026-12-07; a rental expected to cost 100.01 more would pass it"; ok || why != wantWhy {
		t.Errorf("beta's rental past its budget: %v %q, want %q", ok, why, wantWhy)
	}
	// A record stored now counts, and the tenant's spend follows.
	publishRecord(t, ctx, conn.JS, record("beta", "r-b3", "", 40, now))
	waitUntil(t, "beta's new record", func() bool { return l.Spent("beta", PeriodStart(schemas.BudgetWeek, now)) == 40 })

	f := l.Figures(later)
	wantUSD := []metrics.CostUSD{{Tenant: "acme", GPUModel: "A100", USD: 1000}, {Tenant: "acme", GPUModel: "H100", USD: 300},
		{Tenant: "beta", USD: 100}, {Tenant: "delta", USD: 50}, {Tenant: "gamma", GPUModel: "H100", USD: 5000}}
	if !slicesEqual(f.USD, wantUSD) {
		t.Errorf("cost figures %+v, want %+v", f.USD, wantUSD)
	}
	wantSpend := []metrics.TenantSpend{{Tenant: "acme", SpendUSD: 550, BudgetUSD: 500}, {Tenant: "beta", SpendUSD: 40, BudgetUSD: 100}, {Tenant: "delta", SpendUSD: 50, BudgetUSD: 10}}
	if !slicesEqual(f.Tenants, wantSpend) {
		t.Errorf("spend figures %+v, want %+v", f.Tenants, wantSpend)
	}
	wantWaiting := []metrics.RunsWaiting{{Tenant: "acme", WaitCode: "budget", Runs: 2}, {Tenant: "beta", WaitCode: "queued", Runs: 1}}
	if !slicesEqual(f.Waiting, wantWaiting) {
		t.Errorf("waiting figures %+v, want %+v", f.Waiting, wantWaiting)
	}
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A record with a field this build does not know still counts; one that
// is not a record, or names no tenant, does not.
func TestDecodeRecord(t *testing.T) {
	h := nats.Header{codec.ContentTypeHeader: {codec.ContentTypeJSON}}
	var rec schemas.UsageRecord
	if err := DecodeRecord(h, []byte(`{"run_id":"r-1","tenant":"acme","attempt_id":"r-1-a1","cost_usd":2,"region":"eu"}`), &rec); err != nil || rec.CostUSD != 2 {
		t.Errorf("a newer record: %+v, %v", rec, err)
	}
	for _, bad := range []string{`{"run_id":`, `{"run_id":"r-1","attempt_id":"r-1-a1"}`, `{"run_id":"r-1","tenant":"acme","attempt_id":"r-1-a1","cost_usd":-1}`} {
		if err := DecodeRecord(h, []byte(bad), &rec); err == nil {
			t.Errorf("%s decoded", bad)
		}
	}
}
