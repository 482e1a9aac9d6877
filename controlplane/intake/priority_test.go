package intake_test

import (
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/intake"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/schemas"
)

// swappable is a policy source a test reloads at will.
type swappable struct {
	p atomic.Pointer[policy.Snapshot]
}

func (s *swappable) Current() *policy.Snapshot { return s.p.Load() }

// TestIntakePriorityAndRetry: a Run naming a priority class the policy
// does not define is rejected priority_unknown naming the field and
// listing the classes (or saying there are none), and is not stored; a
// known class is stored; a Run's effective retry policy is its own, else
// its tenant's default, else none; a submit delivered again after its
// class was removed keeps its Run.
func TestIntakePriorityAndRetry(t *testing.T) {
	tp := newTenantPlane(t)
	tenantRetry := &schemas.RetryPolicy{On: []schemas.RetryEvent{schemas.RetryOOM}, MaxAttempts: 3, Backoff: "30s"}
	src := &swappable{}
	src.p.Store(policy.Static(schemas.SchedulingPolicy{
		PriorityClasses: []schemas.PriorityClass{{Name: "urgent", Value: 1000, Preempts: true}, {Name: "batch"}},
		Tenants:         map[string]schemas.TenantPolicy{"a": {Retry: tenantRetry, Spot: schemas.SpotAllowed}},
	}, "v1"))
	tp.in = intake.New(tp.store, waiting{}, dispatch.New(tp.conn.JS, tp.cache, time.Now, zap.NewNop()), tp.cat, nil, src, time.Now, zap.NewNop())
	submit := func(tenant string, req schemas.RunRequest, msgID string) (schemas.RunEvent, string) {
		t.Helper()
		tp.send(t, tenant, bus.SubmitSubject(tenant, "alice"), req, msgID)
		id := schemas.RunIDFor(tenant, req.RequestID)
		ev, _ := tp.event(t, bus.RunEventsSubject(tenant, id))
		return ev, id
	}

	unknown := request("unknown-1")
	unknown.Priority = "critical"
	ev, id := submit("a", unknown, "unknown-1")
	if ev.Type != schemas.EventRejected || ev.Code != schemas.CodePriorityUnknown || ev.Field != "priority" || !strings.Contains(ev.Message, "urgent, batch") {
		t.Fatalf("unknown class: %+v", ev)
	}
	if _, err := tp.runsKV.Get(t.Context(), id); err == nil {
		t.Fatal("a Run of an unknown class was stored")
	}

	urgent := request("urgent-1")
	urgent.Priority = "urgent"
	if ev, id = submit("a", urgent, "urgent-1"); ev.Type != schemas.EventAccepted {
		t.Fatalf("known class: %+v", ev)
	}
	if r, _ := tp.run(t, id); r.Request.Priority != "urgent" || !reflect.DeepEqual(r.Retry, tenantRetry) || r.Spot != schemas.SpotAllowed {
		t.Fatalf("stored class %q, retry %+v, spot %q; want urgent and the tenant's defaults %+v, allowed", r.Request.Priority, r.Retry, r.Spot, tenantRetry)
	}
	own := request("own-1")
	own.Retry = &schemas.RetryPolicy{On: []schemas.RetryEvent{schemas.RetryExitNonZero, schemas.RetryNodeLost}, MaxAttempts: 5}
	own.Spot = schemas.SpotNever
	_, id = submit("a", own, "own-1")
	if r, _ := tp.run(t, id); !reflect.DeepEqual(r.Retry, own.Retry) || r.Spot != schemas.SpotNever {
		t.Fatalf("retry %+v, spot %q; want the request's own %+v, never", r.Retry, r.Spot, own.Retry)
	}
	_, id = submit("b", request("none-1"), "none-1")
	if r, _ := tp.run(t, id); r.Retry != nil || r.Spot != schemas.SpotNever {
		t.Fatalf("tenant without a default: retry %+v, spot %q; want none, never", r.Retry, r.Spot)
	}

	// The class is removed by a reload: the submit delivered again keeps
	// its Run; a new Run naming it is refused, and with no class left the
	// refusal says so.
	src.p.Store(policy.Static(schemas.SchedulingPolicy{}, "v2"))
	if ev, _ = submit("a", urgent, "urgent-1-again"); ev.Type == schemas.EventRejected {
		t.Fatalf("a Run accepted before the reload was rejected on redelivery: %+v", ev)
	}
	late := request("late-1")
	late.Priority = "urgent"
	ev, _ = submit("a", late, "late-1")
	if ev.Type != schemas.EventRejected || ev.Code != schemas.CodePriorityUnknown || !strings.Contains(ev.Message, "no priority classes") {
		t.Fatalf("no classes configured: %+v", ev)
	}
}
