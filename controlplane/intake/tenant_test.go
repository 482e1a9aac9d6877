package intake_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/intake"
	"github.com/warmfleet/warmfleet/schemas"
)

// tenantPlane is a plane whose intake streams are tenants a's and b's
// (and the default one's), each read by its own consumer.
type tenantPlane struct {
	plane
	in        *intake.Intake
	consumers map[string]jetstream.Consumer
}

func newTenantPlane(t *testing.T) tenantPlane {
	t.Helper()
	p, _ := newPlane(t)
	ctx := context.Background()
	if err := bus.Provision(ctx, p.conn.JS, bus.Topology{Tenants: []string{"a", "b", schemas.DefaultTenant}}); err != nil {
		t.Fatal(err)
	}
	tp := tenantPlane{plane: p, consumers: map[string]jetstream.Consumer{},
		in: intake.New(p.store, waiting{}, dispatch.New(p.conn.JS, p.cache, time.Now, zap.NewNop()), p.cat, nil, nil, time.Now, zap.NewNop())}
	for _, tenant := range []string{"a", "b"} {
		c, err := p.conn.JS.CreateOrUpdateConsumer(ctx, bus.RunsStream(tenant), bus.IntakeConsumerConfig())
		if err != nil {
			t.Fatal(err)
		}
		tp.consumers[tenant] = c
	}
	return tp
}

// send publishes body on subject (into the tenant's stream) and has
// intake handle it.
func (tp tenantPlane) send(t *testing.T, tenant, subject string, body any, msgID string) {
	t.Helper()
	b, _ := json.Marshal(body)
	m := nats.NewMsg(subject)
	m.Data = b
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	if _, err := tp.conn.JS.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	msgs, err := tp.consumers[tenant].Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range msgs.Messages() {
		tp.in.Handle(context.Background(), intake.Parse(m, false))
	}
}

// event reads the last event stored on subject.
func (tp tenantPlane) event(t *testing.T, subject string) (schemas.RunEvent, bool) {
	t.Helper()
	s, err := tp.conn.JS.Stream(context.Background(), bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(context.Background(), subject)
	if err != nil {
		return schemas.RunEvent{}, false
	}
	var ev schemas.RunEvent
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		t.Fatal(err)
	}
	return ev, true
}

func (tp tenantPlane) run(t *testing.T, id string) (schemas.Run, uint64) {
	t.Helper()
	var r schemas.Run
	rev, err := bus.GetJSON(context.Background(), tp.runsKV, id, &r)
	if err != nil {
		t.Fatalf("run %s: %v", id, err)
	}
	return r, rev
}

// TestIntakeRecordsTenantAndIdentity: a Run records the tenant and the
// identity its submit subject names, under an id of the tenant's request
// id; the same request id in two tenants is two Runs (each accepted on its
// own tenant's event subject), and within one tenant a different request
// under it is refused request_id_conflict, whoever of the tenant sent it.
func TestIntakeRecordsTenantAndIdentity(t *testing.T) {
	tp := newTenantPlane(t)
	reqA, reqB := request("req-1"), request("req-1")
	reqB.Command = []string{"b-only"}
	tp.send(t, "a", bus.SubmitSubject("a", "alice"), reqA, "req-1")
	tp.send(t, "b", bus.SubmitSubject("b", "bob"), reqB, "req-1") // same msg id, another stream: not deduped

	idA, idB := schemas.RunIDFor("a", "req-1"), schemas.RunIDFor("b", "req-1")
	if idA == idB {
		t.Fatal("one request id names the same Run in two tenants")
	}
	for _, c := range []struct{ id, tenant, by string }{{idA, "a", "alice"}, {idB, "b", "bob"}} {
		r, _ := tp.run(t, c.id)
		if r.Tenant != c.tenant || r.SubmittedBy != c.by || r.Request.RequestID != "req-1" {
			t.Errorf("run %s: tenant %q, submitted by %q, request %q; want %s, %s", c.id, r.Tenant, r.SubmittedBy, r.Request.RequestID, c.tenant, c.by)
		}
		if ev, ok := tp.event(t, bus.RunEventsSubject(c.tenant, c.id)); !ok || ev.Type != schemas.EventAccepted {
			t.Errorf("run %s: no accepted event on its tenant's subject: %+v", c.id, ev)
		}
		other := map[string]string{"a": "b", "b": "a"}[c.tenant]
		if ev, ok := tp.event(t, bus.RunEventsSubject(other, c.id)); ok {
			t.Errorf("run %s of %s: an event on tenant %s's subject: %+v", c.id, c.tenant, other, ev)
		}
	}

	// Another identity of tenant a reuses the request id for another Run.
	conflicting := request("req-1")
	conflicting.Command = []string{"other"}
	tp.send(t, "a", bus.SubmitSubject("a", "carol"), conflicting, "req-1-again")
	if ev, _ := tp.event(t, bus.RunEventsSubject("a", idA)); ev.Type != schemas.EventRejected || ev.Code != schemas.CodeRequestIDConflict {
		t.Fatalf("a conflicting request id within tenant a: %+v, want request_id_conflict", ev)
	}
	if r, _ := tp.run(t, idA); r.SubmittedBy != "alice" || len(r.Request.Command) != 0 {
		t.Fatalf("the conflicting submit changed the Run: %+v", r)
	}
}

// TestCancelStaysInItsTenant: tenant b's cancel of a's Run, by its id, is
// refused run_not_found on b's own event subject and a's Run is untouched;
// b's cancel by the same request id names b's own Run; a cancels its own.
func TestCancelStaysInItsTenant(t *testing.T) {
	tp := newTenantPlane(t)
	tp.send(t, "a", bus.SubmitSubject("a", "alice"), request("job"), "job")
	tp.send(t, "b", bus.SubmitSubject("b", "bob"), request("job"), "job")
	idA, idB := schemas.RunIDFor("a", "job"), schemas.RunIDFor("b", "job")
	before, revBefore := tp.run(t, idA)

	tp.send(t, "b", bus.CancelSubject("b", "bob"), schemas.CancelRun{RunID: idA, Reason: "mine now"}, "")
	ev, ok := tp.event(t, bus.RunEventsSubject("b", "rejected"))
	if !ok || ev.Type != schemas.EventRejected || ev.Code != schemas.CodeRunNotFound || ev.Field != "run_id" {
		t.Fatalf("b's cancel of a's Run: %+v (%v), want run_not_found on b's rejected subject", ev, ok)
	}
	after, revAfter := tp.run(t, idA)
	if revAfter != revBefore || after.Phase != before.Phase || after.Phase.Terminal() {
		t.Fatalf("a's Run changed by b's cancel: rev %d -> %d, phase %s -> %s", revBefore, revAfter, before.Phase, after.Phase)
	}
	if ev, _ := tp.event(t, bus.RunEventsSubject("a", idA)); ev.Type != schemas.EventAccepted {
		t.Fatalf("a's Run got an event from b's cancel: %+v", ev)
	}

	// By request id, b names its own Run.
	tp.send(t, "b", bus.CancelSubject("b", "bob"), schemas.CancelRun{RequestID: "job"}, "")
	if r, _ := tp.run(t, idB); r.Phase != schemas.PhaseCancelled {
		t.Fatalf("b's cancel by request id: b's Run is %s, want cancelled", r.Phase)
	}
	if r, rev := tp.run(t, idA); rev != revBefore || r.Phase.Terminal() {
		t.Fatalf("b's cancel by request id reached a's Run: %s", r.Phase)
	}

	tp.send(t, "a", bus.CancelSubject("a", "alice"), schemas.CancelRun{RunID: idA}, "")
	if r, _ := tp.run(t, idA); r.Phase != schemas.PhaseCancelled {
		t.Fatalf("a's own cancel: %s, want cancelled", r.Phase)
	}
}

// TestRejectionsKeptPerTenant: each tenant's stream numbers its messages
// from 1, and a rejection is deduplicated by its stream position: two
// tenants' first messages, both refused, are both answered, each on its
// tenant's subject.
func TestRejectionsKeptPerTenant(t *testing.T) {
	tp := newTenantPlane(t)
	for _, tenant := range []string{"a", "b"} {
		tp.send(t, tenant, bus.SubmitSubject(tenant, "x"), map[string]any{"request_id": "bad-1", "unknown_field": 1}, "")
		ev, ok := tp.event(t, bus.RunEventsSubject(tenant, schemas.RunIDFor(tenant, "bad-1")))
		if !ok || ev.Type != schemas.EventRejected {
			t.Fatalf("tenant %s: the refused submit got %+v (%v), want a rejected event on its own subject", tenant, ev, ok)
		}
	}
}

// TestMalformedIntakeSubjectRefused: a message on a tenant's stream whose
// subject is no intake subject (a stream wider than bus makes) is refused
// with a coded event on that tenant's rejected subject, and stores no Run.
func TestMalformedIntakeSubjectRefused(t *testing.T) {
	tp := newTenantPlane(t)
	ctx := context.Background()
	if _, err := tp.conn.JS.CreateStream(ctx, jetstream.StreamConfig{Name: bus.RunsStream("x"), Subjects: []string{"wf.runs.x.>"}}); err != nil {
		t.Fatal(err)
	}
	c, err := tp.conn.JS.CreateOrUpdateConsumer(ctx, bus.RunsStream("x"), bus.IntakeConsumerConfig())
	if err != nil {
		t.Fatal(err)
	}
	tp.consumers["x"] = c
	for _, subject := range []string{"wf.runs.x.alice.list", "wf.runs.x.alice.extra.submit"} {
		tp.send(t, "x", subject, request("m-1"), "")
		ev, ok := tp.event(t, bus.RunEventsSubject("x", "rejected"))
		if !ok || ev.Type != schemas.EventRejected || ev.Code != schemas.CodeMalformed || ev.Field != "subject" || ev.Message == "" {
			t.Fatalf("%s: %+v (%v), want malformed on subject", subject, ev, ok)
		}
	}
	s, err := tp.conn.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	rejected := bus.RunEventsSubject("x", "rejected")
	if info, err := s.Info(ctx, jetstream.WithSubjectFilter(rejected)); err != nil || info.State.Subjects[rejected] != 2 {
		t.Fatalf("rejections stored on %s: %v (%v), want 2", rejected, info.State.Subjects, err)
	}
	if _, err := tp.runsKV.Get(ctx, schemas.RunIDFor("x", "m-1")); err == nil {
		t.Fatal("a Run was stored from a malformed subject")
	}
}
