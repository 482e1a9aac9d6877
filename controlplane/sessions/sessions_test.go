package sessions_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// fixture is a serving session Service on a provisioned bus.
type fixture struct {
	conn  *bus.Conn
	cache *cache.Cache
	nodes jetstream.KeyValue
	svc   *sessions.Service
	stop  func()
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWith(t, sessions.Config{AttachTimeout: 2 * time.Second, DrainTimeout: 2 * time.Second})
}

// newFixtureWith is newFixture with the service configured by cfg.
func newFixtureWith(t *testing.T, cfg sessions.Config) *fixture {
	t.Helper()
	conn := testenv.ProvisionedBus(t, "sessions-test")
	nodes, err := conn.JS.KeyValue(context.Background(), bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	c := cache.New()
	svc := sessions.New(cfg, conn, c, nodes, nil, nil, nil)
	if v := svc.DrainNode(context.Background(), schemas.NodeRecord{NodeID: "n1"}); v != nil {
		t.Fatalf("DrainNode before Serve = %+v, want nil", v)
	}
	stop, err := svc.Serve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return &fixture{conn: conn, cache: c, nodes: nodes, svc: svc, stop: stop}
}

// addNode writes a ready, live node to wf_nodes and the cache.
func (f *fixture) addNode(t *testing.T, id string, token uint64) {
	t.Helper()
	n := schemas.NodeRecord{NodeID: id, State: schemas.NodeReady, FencingToken: token, LeaseExpires: time.Now().Add(time.Hour)}
	rev, err := bus.CreateJSON(context.Background(), f.nodes, id, n)
	if err != nil {
		t.Fatal(err)
	}
	f.cache.NoteNode(n, rev)
}

// host answers one node's session commands with answer, recording them.
type host struct {
	mu   sync.Mutex
	cmds []schemas.SessionCommand
}

func (h *host) commands() []schemas.SessionCommand {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]schemas.SessionCommand(nil), h.cmds...)
}

func (f *fixture) host(t *testing.T, node string, op schemas.SessionOp, answer func(schemas.SessionCommand) schemas.SessionReply) *host {
	t.Helper()
	h := &host{}
	sub, err := f.conn.NC.Subscribe(bus.NodeSessions(node, string(op)), func(m *nats.Msg) {
		var cmd schemas.SessionCommand
		if err := json.Unmarshal(m.Data, &cmd); err != nil {
			t.Errorf("host %s: %v", node, err)
			return
		}
		h.mu.Lock()
		h.cmds = append(h.cmds, cmd)
		h.mu.Unlock()
		b, _ := json.Marshal(answer(cmd))
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := f.conn.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	return h
}

// ask sends an operator's session request and decodes the reply, checking
// it is JSON.
func (f *fixture) ask(t *testing.T, subject string, body any) schemas.SessionReply {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	m, err := f.conn.NC.Request(subject, b, 5*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	if ct := m.Header.Get(codec.ContentTypeHeader); ct != codec.ContentTypeJSON {
		t.Errorf("reply Content-Type = %q, want %q", ct, codec.ContentTypeJSON)
	}
	var rep schemas.SessionReply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		t.Fatalf("reply %q: %v", m.Data, err)
	}
	return rep
}

// refuse answers every command with a refusal coded c.
func refuse(c residency.Code) func(schemas.SessionCommand) schemas.SessionReply {
	return func(schemas.SessionCommand) schemas.SessionReply {
		return schemas.SessionReply{Error: &schemas.SessionError{Code: c, Message: "refused"}}
	}
}

// accept answers every command with success.
func accept(schemas.SessionCommand) schemas.SessionReply {
	return schemas.SessionReply{Residency: &schemas.ResidencyView{}}
}

// TestAttachPassesNodeRefusals: a node's own refusal passes the attach to
// the next ready node; the command carries the node's fencing token, the
// default actor, and create for a session without durable state.
func TestAttachPassesNodeRefusals(t *testing.T) {
	f := newFixture(t)
	f.addNode(t, "n1", 11)
	f.addNode(t, "n2", 22)
	h1 := f.host(t, "n1", schemas.SessionAttach, refuse(residency.CodeCapacity))
	h2 := f.host(t, "n2", schemas.SessionAttach, accept)

	rep := f.ask(t, bus.SubjectSessionAttach, schemas.SessionRequest{Tenant: "t1", Session: "s1"})
	if rep.Error != nil || rep.Residency == nil {
		t.Fatalf("attach reply = %+v, want a residency", rep)
	}
	if got := h1.commands(); len(got) != 1 || got[0].FencingToken != 11 {
		t.Errorf("n1 commands = %+v, want one with fencing token 11", got)
	}
	got := h2.commands()
	if len(got) != 1 {
		t.Fatalf("n2 commands = %+v, want one", got)
	}
	want := schemas.SessionCommand{FencingToken: 22, Tenant: "t1", Session: "s1", Mode: residency.ModeCreate, Actor: "operator"}
	if !reflect.DeepEqual(got[0], want) {
		t.Errorf("n2 command = %+v, want %+v", got[0], want)
	}
}

// TestAttachStopsAtSessionRefusal: a refusal about the session itself ends
// the search and is the reply.
func TestAttachStopsAtSessionRefusal(t *testing.T) {
	f := newFixture(t)
	f.addNode(t, "n1", 1)
	f.addNode(t, "n2", 2)
	f.host(t, "n1", schemas.SessionAttach, refuse(residency.CodeLeaseHeld))
	h2 := f.host(t, "n2", schemas.SessionAttach, accept)

	rep := f.ask(t, bus.SubjectSessionAttach, schemas.SessionRequest{Tenant: "t1", Session: "s1", Mode: residency.ModeResume})
	if rep.Error == nil || rep.Error.Code != residency.CodeLeaseHeld {
		t.Fatalf("attach reply = %+v, want %s", rep, residency.CodeLeaseHeld)
	}
	if got := h2.commands(); len(got) != 0 {
		t.Errorf("n2 was asked %+v after a session refusal", got)
	}
}

// TestAttachRefusals: a malformed request, a pinned node that is not ready,
// and a fleet without nodes are refused.
func TestAttachRefusals(t *testing.T) {
	f := newFixture(t)
	n := schemas.NodeRecord{NodeID: "d1", State: schemas.NodeDraining, LeaseExpires: time.Now().Add(time.Hour)}
	if _, err := bus.CreateJSON(context.Background(), f.nodes, n.NodeID, n); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		body any
		want residency.Code
	}{
		{"malformed", "not a request", residency.CodeInvalidRequest},
		{"no session", schemas.SessionRequest{Tenant: "t1"}, residency.CodeInvalidRequest},
		{"pinned unknown node", schemas.SessionRequest{Tenant: "t1", Session: "s1", Node: "nope"}, residency.CodeInvalidRequest},
		{"pinned draining node", schemas.SessionRequest{Tenant: "t1", Session: "s1", Node: "d1"}, residency.CodeDraining},
		{"no ready node", schemas.SessionRequest{Tenant: "t1", Session: "s1"}, residency.CodeCapacity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := f.ask(t, bus.SubjectSessionAttach, tc.body)
			if rep.Error == nil || rep.Error.Code != tc.want {
				t.Errorf("reply = %+v, want %s", rep, tc.want)
			}
		})
	}
}

// TestAttachPinnedNodeLiveByHeartbeats: a pinned node is live by the lease
// its heartbeats earned (in memory), not only by the one its record stored
// at its last state change.
func TestAttachPinnedNodeLiveByHeartbeats(t *testing.T) {
	f := newFixture(t)
	n := schemas.NodeRecord{NodeID: "n1", State: schemas.NodeReady, FencingToken: 3, LeaseExpires: time.Now().Add(-time.Minute)}
	rev, err := bus.CreateJSON(context.Background(), f.nodes, n.NodeID, n)
	if err != nil {
		t.Fatal(err)
	}
	f.cache.NoteNode(n, rev)
	h := f.host(t, "n1", schemas.SessionAttach, accept)
	pinned := schemas.SessionRequest{Tenant: "t1", Session: "s1", Node: "n1"}
	if rep := f.ask(t, bus.SubjectSessionAttach, pinned); rep.Error == nil || rep.Error.Code != residency.CodeDraining {
		t.Fatalf("attach on a node without a live lease = %+v, want %s", rep, residency.CodeDraining)
	}
	if got := h.commands(); len(got) != 0 {
		t.Fatalf("a node without a live lease was asked %+v", got)
	}
	if res := f.cache.Heartbeat("n1", 3, time.Now().Add(time.Hour)); res != cache.HeartbeatExtended {
		t.Fatalf("heartbeat = %v", res)
	}
	if rep := f.ask(t, bus.SubjectSessionAttach, pinned); rep.Error != nil || rep.Residency == nil {
		t.Fatalf("attach on a heartbeating node whose stored lease passed = %+v, want a residency", rep)
	}
	if got := h.commands(); len(got) != 1 || got[0].FencingToken != 3 {
		t.Errorf("n1 commands = %+v, want one with fencing token 3", got)
	}
}

// TestReleaseGoesToRoutedHost: a release goes to the host wf_residency
// routes the session to; a session routed nowhere is not resident.
func TestReleaseGoesToRoutedHost(t *testing.T) {
	f := newFixture(t)
	rep := f.ask(t, bus.SubjectSessionRelease, schemas.SessionRequest{Tenant: "t1", Session: "s1"})
	if rep.Error == nil || rep.Error.Code != residency.CodeNotResident {
		t.Fatalf("release of an unrouted session = %+v, want %s", rep, residency.CodeNotResident)
	}

	f.addNode(t, "n1", 7)
	f.route(t, residency.Observation{Tenant: "t1", Session: "s1", Host: "n1", Epoch: 3, State: residency.StateResident})
	h := f.host(t, "n1", schemas.SessionRelease, accept)
	rep = f.ask(t, bus.SubjectSessionRelease, schemas.SessionRequest{Tenant: "t1", Session: "s1"})
	if rep.Error != nil {
		t.Fatalf("release = %+v", rep)
	}
	want := schemas.SessionCommand{FencingToken: 7, Tenant: "t1", Session: "s1"}
	if got := h.commands(); len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Errorf("n1 commands = %+v, want [%+v]", got, want)
	}
}

// route writes an observation straight into wf_residency.
func (f *fixture) route(t *testing.T, o residency.Observation) {
	t.Helper()
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketResidency)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), bus.ResidencyKey(o.Tenant, o.Session), b); err != nil {
		t.Fatal(err)
	}
}

// TestDrainNode: the host's drain report is returned with whatever
// wf_residency still routes to the node added as unreleased; a node without
// a session host reports no_session_host; a stopped Service drains nothing.
func TestDrainNode(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.addNode(t, "n1", 1)
	f.route(t, residency.Observation{Tenant: "t1", Session: "kept", Host: "n1", Epoch: 2, State: residency.StateResident})
	f.route(t, residency.Observation{Tenant: "t1", Session: "gone", Host: "n1", Epoch: 2, State: residency.StateExpired})
	f.route(t, residency.Observation{Tenant: "t1", Session: "elsewhere", Host: "n2", Epoch: 2, State: residency.StateResident})

	rec := schemas.NodeRecord{NodeID: "n1", FencingToken: 1}
	v := f.svc.DrainNode(ctx, rec)
	if v == nil || v.Error == nil || v.Error.Code != residency.CodeNoHost {
		t.Fatalf("drain without a host = %+v, want %s", v, residency.CodeNoHost)
	}
	if v.Released == nil || len(v.Failures) != 1 || v.Failures[0].Key != (schemas.SessionKey{Tenant: "t1", Session: "kept"}) {
		t.Errorf("drain without a host = %+v, want released [] and t1.kept unreleased", v)
	}

	released := schemas.SessionKey{Tenant: "t1", Session: "other"}
	f.host(t, "n1", schemas.SessionDrain, func(schemas.SessionCommand) schemas.SessionReply {
		return schemas.SessionReply{Drain: &schemas.DrainView{Node: "n1", Released: []schemas.SessionKey{released},
			Failures: []schemas.DrainFailure{{Key: schemas.SessionKey{Tenant: "t1", Session: "kept"}, Reason: "busy"}}}}
	})
	v = f.svc.DrainNode(ctx, rec)
	if v == nil || v.Error != nil || len(v.Released) != 1 || v.Released[0] != released {
		t.Fatalf("drain = %+v, want t1.other released", v)
	}
	if len(v.Failures) != 1 || v.Failures[0].Reason != "busy" {
		t.Errorf("drain failures = %+v, want only the host's", v.Failures)
	}

	routes, err := sessions.ListRoutes(ctx, f.conn.JS)
	if err != nil || len(routes) != 3 || routes[0].Session != "elsewhere" {
		t.Errorf("ListRoutes = %+v, %v; want 3 sorted by key", routes, err)
	}

	f.stop()
	if v := f.svc.DrainNode(ctx, rec); v != nil {
		t.Errorf("DrainNode after stop = %+v, want nil", v)
	}
	if _, err := f.conn.NC.Request(bus.SubjectSessionAttach, []byte(`{}`), 200*time.Millisecond); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("attach after stop: %v, want no responders", err)
	}
}
