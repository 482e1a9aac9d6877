package sessions_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

const (
	tenant  = "acme"
	compatA = "busybox-sleep@1"
)

// agentConn is a connection of the agents' own, as a node's would be.
func (f *fixture) agentConn(t *testing.T) *nats.Conn {
	t.Helper()
	return testenv.Dial(t, f.conn.NC.ConnectedUrl(), "agent").NC
}

// place records, as an operator's attach does before it asks the node,
// that key is placed on node for the next minute: node may acquire its lease.
func (f *fixture) place(t *testing.T, key residency.Key, node string) {
	t.Helper()
	b, err := json.Marshal(schemas.SessionPlacement{Tenant: key.Tenant, Session: key.Session, Node: node, ExpiresAt: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv(t, f, bus.BucketLeases).Put(context.Background(), bus.SessionPlacementKey(key.Tenant, key.Session), b); err != nil {
		t.Fatal(err)
	}
}

// remote is node's residency client on nc.
func remote(nc *nats.Conn, node string) *residency.Remote {
	return &residency.Remote{NC: nc, NodeID: node, Timeout: 5 * time.Second}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The wire keeps typed errors: a caller matches them with errors.Is exactly
// as it would in process, and the subject's node id is the only identity.
func TestRemote_TypedErrorsAndIdentity(t *testing.T) {
	f := newFixture(t)
	nc := f.agentConn(t)
	ctx := testCtx(t)
	a, b := remote(nc, "host-a"), remote(nc, "host-b")
	key := residency.Key{Tenant: tenant, Session: "wire-1"}

	f.place(t, key, "host-a")
	g, err := a.AcquireSessionLease(ctx, key, "host-a")
	if err != nil || g.Epoch != 1 || g.Holder != "host-a" {
		t.Fatalf("acquire: %+v, %v", g, err)
	}
	if _, err := b.AcquireSessionLease(ctx, key, "host-b"); !errors.Is(err, residency.ErrNotPlaced) {
		t.Fatalf("a node the session is not placed on: %v, want ErrNotPlaced", err)
	}
	f.place(t, key, "host-b")
	if _, err := b.AcquireSessionLease(ctx, key, "host-b"); !errors.Is(err, residency.ErrLeaseHeld) {
		t.Fatalf("second holder: %v, want ErrLeaseHeld", err)
	}
	if _, err := b.RenewSessionLease(ctx, g); !errors.Is(err, residency.ErrForbidden) {
		t.Fatalf("host-b renewing host-a's grant: %v, want ErrForbidden", err)
	}
	if _, err := a.AcquireSessionLease(ctx, key, "host-b"); !errors.Is(err, residency.ErrForbidden) {
		t.Fatalf("host-a acquiring for host-b: %v, want ErrForbidden", err)
	}
	ng, err := a.RenewSessionLease(ctx, g)
	if err != nil || ng.Revision <= g.Revision {
		t.Fatalf("renew: %+v, %v", ng, err)
	}
	// The grant at its older revision, as after a renewal whose answer was
	// lost on the wire: the token still names it, so it renews.
	if ng2, err := a.RenewSessionLease(ctx, g); err != nil || ng2.Revision <= ng.Revision {
		t.Fatalf("renew at a stale revision of the same grant: %+v, %v", ng2, err)
	} else {
		ng = ng2
	}
	obs := residency.Observation{Tenant: key.Tenant, Session: key.Session, Host: "host-a", Epoch: 1, State: residency.StateResident, Accepting: true, ObservedAt: time.Now()}
	if err := a.PublishResidency(ctx, obs); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if err := b.TombstoneResidency(ctx, key, "host-b", 1); !errors.Is(err, residency.ErrNotLeaseHolder) {
		t.Fatalf("host-b tombstoning host-a's epoch: %v, want ErrNotLeaseHolder", err)
	}
	if err := a.ReleaseSessionLease(ctx, ng); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := a.TombstoneResidency(ctx, key, "host-a", 1); err != nil {
		t.Fatalf("tombstone: %v", err)
	}
	if err := a.PublishResidency(ctx, obs); !errors.Is(err, residency.ErrTombstoned) {
		t.Fatalf("publish over own tombstone: %v, want ErrTombstoned", err)
	}
	// host-b takes over at epoch 2; host-a's epoch-1 writes are refused.
	g2, err := b.AcquireSessionLease(ctx, key, "host-b")
	if err != nil || g2.Epoch != 2 {
		t.Fatalf("successor: %+v, %v", g2, err)
	}
	if err := a.PublishResidency(ctx, obs); !errors.Is(err, residency.ErrEpochSuperseded) {
		t.Fatalf("late publish: %v, want ErrEpochSuperseded", err)
	}
	// Nobody answering is a transport failure, never a lost lease.
	none := &residency.Remote{NC: nc, NodeID: "host-a", Timeout: 300 * time.Millisecond}
	nc.Close()
	if _, err := none.RenewSessionLease(context.Background(), g2); errors.Is(err, residency.ErrLeaseLost) || !errors.Is(err, residency.ErrServiceUnavailable) {
		t.Fatalf("renew with no service: %v, want ErrServiceUnavailable and not ErrLeaseLost", err)
	}
}

// wf_sessions: a create is allowed only when no earlier residency ran, a
// checkpoint under a superseded epoch is refused, and what a release commits
// is what the next resume loads.
func TestKVSessions_JournalStateAndFence(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	a := remote(f.agentConn(t), "host-a")
	key := residency.Key{Tenant: tenant, Session: "durable-1"}

	if _, err := a.LoadSessionState(ctx, key); !errors.Is(err, residency.ErrNotLeaseHolder) {
		t.Fatalf("load before holding the lease: %v, want ErrNotLeaseHolder", err)
	}
	f.place(t, key, "host-a")
	g, err := a.AcquireSessionLease(ctx, key, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.LoadSessionState(ctx, key)
	if err != nil || st.Exists || st.RuntimeJournal != residency.JournalEmpty || st.Namespace != residency.NamespaceFor(key) {
		t.Fatalf("fresh session under the first grant: %+v, %v", st, err)
	}
	if err := a.ReleaseSessionLease(ctx, g); err != nil {
		t.Fatal(err)
	}
	// Epoch 1 ran and recorded nothing: a later create fails closed.
	if _, err := a.AcquireSessionLease(ctx, key, "host-a"); err != nil {
		t.Fatal(err)
	}
	if st, _ := a.LoadSessionState(ctx, key); st.RuntimeJournal != residency.JournalUnknown || st.Exists {
		t.Fatalf("after an unrecorded residency: %+v, want journal unknown", st)
	}
	cp := residency.Checkpoint{Key: residency.WireKey(key), Host: "host-a", Epoch: 2, Sequence: 3, CompatibilityID: compatA, Namespace: residency.NamespaceFor(key)}
	if err := a.CommitCheckpoint(ctx, cp); err != nil {
		t.Fatal(err)
	}
	st, err = a.LoadSessionState(ctx, key)
	if err != nil || !st.Exists || st.CheckpointSequence != 3 || !st.HasCheckpoint || st.CompatibilityID != compatA || st.RuntimeJournal != residency.JournalPresent {
		t.Fatalf("after checkpoint: %+v, %v", st, err)
	}
	old := cp
	old.Epoch, old.Sequence = 1, 9
	if err := a.CommitCheckpoint(ctx, old); !errors.Is(err, residency.ErrEpochSuperseded) {
		t.Fatalf("checkpoint under epoch 1: %v, want ErrEpochSuperseded", err)
	}
	back := cp
	back.Sequence = 2
	if err := a.CommitCheckpoint(ctx, back); !errors.Is(err, residency.ErrEpochSuperseded) {
		t.Fatalf("checkpoint going backwards: %v, want ErrEpochSuperseded", err)
	}
	other := cp
	other.Host = "host-b"
	if err := a.CommitCheckpoint(ctx, other); !errors.Is(err, residency.ErrForbidden) {
		t.Fatalf("checkpoint for another host: %v, want ErrForbidden", err)
	}
}

// askRaw sends body as JSON on node's subject for op and returns the raw
// reply, checking it is JSON.
func askRaw(t *testing.T, nc *nats.Conn, node string, op schemas.ResidencyOp, body []byte) []byte {
	t.Helper()
	msg := &nats.Msg{Subject: bus.NodeResidencyService(node, string(op)), Data: body, Header: nats.Header{codec.ContentTypeHeader: []string{codec.ContentTypeJSON}}}
	m, err := nc.RequestMsg(msg, 5*time.Second)
	if err != nil {
		t.Fatalf("%s as %s: %v", op, node, err)
	}
	if ct := m.Header.Get(codec.ContentTypeHeader); ct != codec.ContentTypeJSON {
		t.Errorf("%s: reply Content-Type = %q, want %q", op, ct, codec.ContentTypeJSON)
	}
	return m.Data
}

// ask is askRaw of a value, its reply's error decoded as a caller sees it.
func ask(t *testing.T, nc *nats.Conn, node string, op schemas.ResidencyOp, body any) (json.RawMessage, error) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.ResidencyReply[json.RawMessage]
	if err := json.Unmarshal(askRaw(t, nc, node, op, b), &rep); err != nil {
		t.Fatalf("%s: reply: %v", op, err)
	}
	if rep.Error != nil {
		return nil, residency.ErrorFromWire(rep.Error)
	}
	if rep.OK == nil {
		t.Fatalf("%s: a reply with neither ok nor error", op)
	}
	return *rep.OK, nil
}

// Every operation that names a holder refuses, with code forbidden, a body
// whose holder is not the node in the subject; one naming the subject's node
// is refused, with code not_lease_holder, unless that node holds the lease
// at exactly the body's epoch (a higher epoch is no takeover); an acquire
// of a session not placed on the node is refused not_placed_here. The
// holder's lease, route and checkpoint stay as they were.
func TestResidency_RefusesAnotherNodesHolding(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	nc := f.agentConn(t)
	a := remote(nc, "host-a")
	key := residency.Key{Tenant: tenant, Session: "holder-1"}
	f.place(t, key, "host-a")
	g, err := a.AcquireSessionLease(ctx, key, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	obs := residency.Observation{Tenant: key.Tenant, Session: key.Session, Host: "host-a", Epoch: g.Epoch, State: residency.StateResident, Accepting: true, ObservedAt: time.Now()}
	if err := a.PublishResidency(ctx, obs); err != nil {
		t.Fatal(err)
	}
	cp := residency.Checkpoint{Key: residency.WireKey(key), Host: "host-a", Epoch: g.Epoch, Sequence: 1, CompatibilityID: compatA, Namespace: residency.NamespaceFor(key)}
	if err := a.CommitCheckpoint(ctx, cp); err != nil {
		t.Fatal(err)
	}
	later := cp
	later.Sequence = 5
	for _, c := range []struct {
		op   schemas.ResidencyOp
		body any
	}{
		{schemas.ResidencyLeaseRenew, g},
		{schemas.ResidencyLeaseRelease, g},
		{schemas.ResidencyRoutePublish, schemas.ResidencyObservation(obs)},
		{schemas.ResidencyStateCheckpoint, later},
	} {
		_, err := ask(t, nc, "host-b", c.op, c.body)
		var we *residency.WireError
		if !errors.Is(err, residency.ErrForbidden) || !errors.As(err, &we) || we.Code != residency.CodeForbidden {
			t.Errorf("%s of host-a's holding as host-b: %v, want code %s", c.op, err, residency.CodeForbidden)
		}
	}
	// Bodies naming host-b itself, at host-a's epoch or any higher one,
	// are refused: host-b holds no lease on the session.
	for _, e := range []residency.ResidencyEpoch{g.Epoch, g.Epoch + 1, 1 << 62} {
		own := obs
		own.Host, own.Epoch = "host-b", e
		ownCP := later
		ownCP.Host, ownCP.Epoch = "host-b", e
		forged := g
		forged.Holder, forged.Epoch = "host-b", e
		for _, c := range []struct {
			op   schemas.ResidencyOp
			body any
		}{
			{schemas.ResidencyLeaseRenew, forged},
			{schemas.ResidencyLeaseRelease, forged},
			{schemas.ResidencyRoutePublish, schemas.ResidencyObservation(own)},
			{schemas.ResidencyRouteTombstone, schemas.ResidencyTombstoneRequest{Key: residency.WireKey(key), Epoch: e}},
			{schemas.ResidencyStateCheckpoint, ownCP},
		} {
			_, err := ask(t, nc, "host-b", c.op, c.body)
			var we *residency.WireError
			if !errors.Is(err, residency.ErrNotLeaseHolder) || !errors.As(err, &we) || we.Code != residency.CodeNotLeaseHolder {
				t.Errorf("%s as host-b at epoch %d: %v, want code %s", c.op, e, err, residency.CodeNotLeaseHolder)
			}
		}
	}
	// Nor may host-b read the session's state, or acquire the lease of a
	// session not placed on it.
	if _, err := ask(t, nc, "host-b", schemas.ResidencyStateLoad, schemas.ResidencyKeyRequest{Key: residency.WireKey(key)}); !errors.Is(err, residency.ErrNotLeaseHolder) {
		t.Errorf("load as host-b: %v, want ErrNotLeaseHolder", err)
	}
	if _, err := a.LoadSessionState(ctx, key); err != nil {
		t.Errorf("load as host-a, the holder: %v", err)
	}
	if _, err := ask(t, nc, "host-b", schemas.ResidencyLeaseAcquire, schemas.ResidencyKeyRequest{Key: residency.WireKey(key), Token: "t"}); !errors.Is(err, residency.ErrNotPlaced) {
		t.Errorf("acquire as host-b: %v, want ErrNotPlaced", err)
	}
	// host-a itself, at an epoch above its grant, is refused too.
	high := obs
	high.Epoch = 1 << 62
	if err := a.PublishResidency(ctx, high); !errors.Is(err, residency.ErrNotLeaseHolder) {
		t.Errorf("host-a at epoch 2^62: %v, want ErrNotLeaseHolder", err)
	}
	// Nothing of host-a's moved: its grant renews at its revision, its
	// route and checkpoint are as it wrote them.
	if _, err := a.RenewSessionLease(ctx, g); err != nil {
		t.Fatalf("host-a's renewal after the refusals: %v", err)
	}
	var route residency.Observation
	if _, err := bus.GetJSON(ctx, kv(t, f, bus.BucketResidency), key.String(), &route); err != nil || route.Host != "host-a" || route.State != residency.StateResident {
		t.Fatalf("route after the refusals: %+v, %v", route, err)
	}
	if st, err := a.LoadSessionState(ctx, key); err != nil || st.CheckpointSequence != 1 {
		t.Fatalf("durable state after the refusals: %+v, %v", st, err)
	}
}

func kv(t *testing.T, f *fixture, bucket string) jetstream.KeyValue {
	t.Helper()
	b, err := f.conn.JS.KeyValue(context.Background(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A body that is not the operation's request is refused with code
// invalid_request (ErrInvalidRequest on the caller's side), on every
// operation: garbage, an unknown field, a field of the wrong type, nothing.
func TestResidency_MalformedBodyRefused(t *testing.T) {
	f := newFixture(t)
	nc := f.agentConn(t)
	ops := []schemas.ResidencyOp{schemas.ResidencyLeaseAcquire, schemas.ResidencyLeaseRenew, schemas.ResidencyLeaseRelease,
		schemas.ResidencyRoutePublish, schemas.ResidencyRouteTombstone, schemas.ResidencyStateLoad, schemas.ResidencyStateCheckpoint}
	for _, op := range ops {
		for _, body := range []string{`not json`, `{"no_such_field":1}`, `{"key":"acme.s1"}`, ``} {
			var rep schemas.ResidencyReply[json.RawMessage]
			raw := askRaw(t, nc, "host-a", op, []byte(body))
			if err := json.Unmarshal(raw, &rep); err != nil {
				t.Fatalf("%s %q: reply %q: %v", op, body, raw, err)
			}
			if rep.OK != nil || rep.Error == nil || rep.Error.Code != residency.CodeInvalidRequest ||
				!errors.Is(residency.ErrorFromWire(rep.Error), residency.ErrInvalidRequest) {
				t.Errorf("%s %q: reply %s, want an error with code %s", op, body, raw, residency.CodeInvalidRequest)
			}
		}
	}
}

// The reply envelope: {"ok":<result>} (an empty object for an operation
// with no result) or {"error":{"code":…,"message":…}}, never both; agents
// of this version decode exactly these.
func TestResidency_ReplyEnvelope(t *testing.T) {
	f := newFixture(t)
	nc := f.agentConn(t)
	key := schemas.SessionKey{Tenant: tenant, Session: "envelope-1"}
	f.place(t, residency.KeyOf(key), "host-a")
	b, _ := json.Marshal(schemas.ResidencyKeyRequest{Key: key, Token: "tok-1"})
	raw := askRaw(t, nc, "host-a", schemas.ResidencyLeaseAcquire, b)
	if !strings.HasPrefix(string(raw), `{"ok":{"key":{"tenant":"acme","session":"envelope-1"},"holder":"host-a","epoch":1,"revision":`) ||
		!strings.HasSuffix(string(raw), `,"token":"tok-1"}}`) {
		t.Errorf("acquire reply = %s", raw)
	}
	var rep schemas.ResidencyReply[schemas.SessionLeaseGrant]
	if err := json.Unmarshal(raw, &rep); err != nil || rep.OK == nil {
		t.Fatalf("acquire reply %s: %v", raw, err)
	}
	b, _ = json.Marshal(*rep.OK)
	if raw := askRaw(t, nc, "host-a", schemas.ResidencyLeaseRelease, b); string(raw) != `{"ok":{}}` {
		t.Errorf("release reply = %s, want {\"ok\":{}}", raw)
	}
	raw = askRaw(t, nc, "host-b", schemas.ResidencyLeaseRelease, b)
	want := `{"error":{"code":"forbidden","message":"residency: principal not allowed for tenant: node host-b may not act on the lease of \"host-a\""}}`
	if string(raw) != want {
		t.Errorf("refused release reply =\n %s\nwant\n %s", raw, want)
	}
	// Each operation is served on its own subject: one no server knows has
	// no responder.
	if _, err := nc.Request(bus.NodeResidencyService("host-a", "lease_steal"), []byte(`{}`), time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("unknown operation: %v, want no responders", err)
	}
}

// An operator's attach places the session on each node before asking it:
// the node asked may acquire the lease while it attaches (here n1 takes and
// gives it back, then refuses for capacity; n2 keeps it), and once the
// attach moved on, the node it left may not.
func TestAttachPlacesBeforeAsking(t *testing.T) {
	f := newFixture(t)
	f.addNode(t, "n1", 11)
	f.addNode(t, "n2", 22)
	nc := f.agentConn(t)
	key := residency.Key{Tenant: "t1", Session: "placed-1"}
	ctx := testCtx(t)
	var n1Err, n2Err error
	f.host(t, "n1", schemas.SessionAttach, func(schemas.SessionCommand) schemas.SessionReply {
		g, err := remote(nc, "n1").AcquireSessionLease(ctx, key, "n1")
		if n1Err = err; err == nil {
			n1Err = remote(nc, "n1").ReleaseSessionLease(ctx, g)
		}
		return refuse(residency.CodeCapacity)(schemas.SessionCommand{})
	})
	f.host(t, "n2", schemas.SessionAttach, func(cmd schemas.SessionCommand) schemas.SessionReply {
		_, n2Err = remote(nc, "n2").AcquireSessionLease(ctx, key, "n2")
		return accept(cmd)
	})
	if rep := f.ask(t, bus.SubjectSessionAttach, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session}); rep.Error != nil {
		t.Fatalf("attach: %+v", rep.Error)
	}
	if n1Err != nil || n2Err != nil {
		t.Fatalf("acquires while asked: n1 %v, n2 %v; want both granted", n1Err, n2Err)
	}
	if _, err := remote(nc, "n1").AcquireSessionLease(ctx, key, "n1"); !errors.Is(err, residency.ErrNotPlaced) {
		t.Fatalf("n1 after the attach moved to n2: %v, want ErrNotPlaced", err)
	}
}
