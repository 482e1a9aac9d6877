package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// Tests of the control plane's hot paths (docs/benchmarks.md, hot spots 1–5):
// concurrent intake that keeps one Run's messages in order, heartbeats that
// extend an in-memory lease without writing wf_nodes, a scheduler that does
// not republish unchanged decisions, and each event published once.

type testPlane struct {
	url    string
	conn   *bus.Conn // a client's connection
	cp     *controlplane.ControlPlane
	ctx    context.Context
	cancel context.CancelFunc
	done   chan error
}

func startTestPlane(t *testing.T, cfg controlplane.Config) *testPlane {
	t.Helper()
	n := testenv.StartNATS(t)
	pl := &testPlane{url: n.URL(), conn: testenv.Dial(t, n.URL(), "client")}
	pl.start(t, cfg)
	return pl
}

// start runs a control plane on the plane's server until stop or cleanup.
func (pl *testPlane) start(t *testing.T, cfg controlplane.Config) {
	t.Helper()
	pl.ctx, pl.cancel = context.WithCancel(context.Background())
	cp, err := controlplane.New(pl.ctx, testenv.Dial(t, pl.url, "cp"), cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	pl.cp, pl.done = cp, make(chan error, 1)
	go func() { pl.done <- cp.Run(pl.ctx) }()
	t.Cleanup(pl.stop)
	select {
	case <-cp.Ready():
	case err := <-pl.done:
		t.Fatalf("control plane stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("control plane not ready")
	}
}

// stop ends the control plane and waits for every goroutine it owns.
func (pl *testPlane) stop() {
	if pl.cancel == nil {
		return
	}
	pl.cancel()
	<-pl.done
	pl.cancel = nil
}

func eventually(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
	}
}

// waitHandled waits until the work-queue stream holds nothing on subject:
// every message published there so far was handled and acknowledged, which
// removes it.
func (pl *testPlane) waitHandled(t *testing.T, stream, subject string) {
	t.Helper()
	eventually(t, 20*time.Second, stream+" to hold nothing unhandled on "+subject, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := pl.conn.JS.Stream(ctx, stream)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
		return err == nil && info.State.Subjects[subject] == 0
	})
}

// storedEvents is how many events WF_EVENTS holds for a Run.
func (pl *testPlane) storedEvents(t *testing.T, runID string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := pl.conn.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(bus.RunEventsSubject(schemas.DefaultTenant, runID)))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[bus.RunEventsSubject(schemas.DefaultTenant, runID)]
}

func (pl *testPlane) publish(t *testing.T, subject, msgID string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: subject, Data: b, Header: nats.Header{}}
	m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
	if _, err := pl.conn.JS.PublishMsg(context.Background(), m, jetstream.WithMsgID(msgID)); err != nil {
		t.Fatal(err)
	}
}

func (pl *testPlane) run(t *testing.T, id string) (schemas.Run, bool) {
	t.Helper()
	kv, err := pl.conn.JS.KeyValue(context.Background(), bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	var r schemas.Run
	_, err = bus.GetJSON(context.Background(), kv, id, &r)
	return r, err == nil
}

func (pl *testPlane) node(t *testing.T, id string) (schemas.NodeRecord, uint64) {
	t.Helper()
	kv, err := pl.conn.JS.KeyValue(context.Background(), bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	var n schemas.NodeRecord
	rev, err := bus.GetJSON(context.Background(), kv, id, &n)
	if err != nil {
		t.Fatalf("node %s: %v", id, err)
	}
	return n, rev
}

func (pl *testPlane) enroll(t *testing.T, nodeID string) schemas.Enrollment {
	t.Helper()
	req := schemas.EnrollmentRequest{NodeID: nodeID, Generation: 1, AgentVersion: "test",
		Capacity: schemas.Resources{CPUMillis: 1000, MemoryBytes: 1 << 30}}
	data, err := codec.Encode(codec.MsgPack, req)
	if err != nil {
		t.Fatal(err)
	}
	m, err := pl.conn.NC.Request(bus.SubjectEnroll, data, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.Reply[schemas.Enrollment]
	if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &rep); err != nil || rep.OK == nil {
		t.Fatalf("enroll %s: %v %+v", nodeID, err, rep.Refusal)
	}
	return *rep.OK
}

func (pl *testPlane) heartbeat(t *testing.T, nodeID string, token uint64) {
	t.Helper()
	b, err := codec.Encode(codec.MsgPack, schemas.Heartbeat{NodeID: nodeID, FencingToken: token, SentAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := pl.conn.NC.Publish(bus.NodeHeartbeat(nodeID), b); err != nil {
		t.Fatal(err)
	}
	_ = pl.conn.NC.Flush()
}

func testRequest(id string) schemas.RunRequest {
	return schemas.RunRequest{RequestID: id, Image: "localhost/test@sha256:" + fmt.Sprintf("%064x", 1),
		Command: []string{"true"}, Resources: schemas.Resources{CPUMillis: 10, MemoryBytes: 16 << 20}}
}

// TestIntakeConcurrentKeepsRunOrder: many producers submit at once, and
// each Run's cancel is published right behind its submit. The intake
// workers handle Runs concurrently, but one Run's cancel never overtakes its
// submit: every Run ends cancelled, none is refused as unknown.
func TestIntakeConcurrentKeepsRunOrder(t *testing.T) {
	pl := startTestPlane(t, controlplane.Config{WaitForCapacity: true})
	const producers, perProducer = 8, 25
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range perProducer {
				rid := fmt.Sprintf("order-%d-%d", p, i)
				pl.publish(t, bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), rid, testRequest(rid))
				pl.publish(t, bus.CancelSubject(schemas.DefaultTenant, bus.OperatorUser), "cancel-"+rid, schemas.CancelRun{RunID: schemas.RunIDFor(schemas.DefaultTenant, rid), Reason: "test"})
			}
		})
	}
	wg.Wait()
	eventually(t, 60*time.Second, "every Run cancelled", func() bool {
		for p := range producers {
			for i := range perProducer {
				r, ok := pl.run(t, schemas.RunIDFor(schemas.DefaultTenant, fmt.Sprintf("order-%d-%d", p, i)))
				if !ok || r.Phase != schemas.PhaseCancelled {
					return false
				}
			}
		}
		return true
	})
	if got := pl.cp.Metrics().Rejected; got != 0 {
		t.Fatalf("%d intake messages refused; a cancel overtook its submit", got)
	}
}

// TestHeartbeatsDoNotWriteNodes: heartbeats of a live node's session extend
// its lease without a wf_nodes write; a heartbeat of a superseded session is
// refused; a node that stops is marked lost by CAS with the lease it was
// last granted, and comes back ready when it heartbeats again.
func TestHeartbeatsDoNotWriteNodes(t *testing.T) {
	const hb = 200 * time.Millisecond
	pl := startTestPlane(t, controlplane.Config{HeartbeatInterval: hb, LeaseMultiplier: 3, ReconcileInterval: 50 * time.Millisecond, WaitForCapacity: true, OpenEnrollment: true})
	old := pl.enroll(t, "n1")
	enr := pl.enroll(t, "n1") // a second session supersedes the first
	if enr.FencingToken <= old.FencingToken {
		t.Fatalf("fencing token did not rise: %d → %d", old.FencingToken, enr.FencingToken)
	}
	_, rev0 := pl.node(t, "n1")
	beat := func(token uint64, d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(hb / 2) {
			pl.heartbeat(t, "n1", token)
		}
	}
	// Well past the lease written at enrollment (3 × 200 ms).
	beat(enr.FencingToken, 1500*time.Millisecond)
	lastGood := time.Now()
	rec, rev := pl.node(t, "n1")
	if rec.State != schemas.NodeReady {
		t.Fatalf("heartbeating node is %s", rec.State)
	}
	if rev != rev0 {
		t.Fatalf("heartbeats wrote wf_nodes: revision %d → %d", rev0, rev)
	}
	if pl.cp.Metrics().Heartbeats == 0 {
		t.Fatal("no heartbeat counted")
	}

	// The superseded session's heartbeats are refused and keep nothing alive.
	fenced := pl.cp.Metrics().FencedObservations
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(hb / 2) {
		pl.heartbeat(t, "n1", old.FencingToken)
	}
	eventually(t, 5*time.Second, "stale heartbeats counted as fenced", func() bool { return pl.cp.Metrics().FencedObservations > fenced })
	eventually(t, 5*time.Second, "node marked lost", func() bool {
		rec, _ := pl.node(t, "n1")
		return rec.State == schemas.NodeLost
	})
	rec, _ = pl.node(t, "n1")
	if want := lastGood.Add(3 * hb); rec.LeaseExpires.Before(want.Add(-300 * time.Millisecond)) {
		t.Fatalf("lost record's lease %s is not the one its last heartbeat earned (about %s)", rec.LeaseExpires, want)
	}
	if pl.cp.Metrics().LeaseLapses == 0 {
		t.Fatal("lapse not counted")
	}

	// Its current session heartbeats again: ready, by one CAS.
	pl.heartbeat(t, "n1", enr.FencingToken)
	eventually(t, 5*time.Second, "node ready again", func() bool {
		rec, _ := pl.node(t, "n1")
		return rec.State == schemas.NodeReady && rec.FencingToken == enr.FencingToken
	})
}

// TestRestartGrantsGraceLease: a restarted control plane has heard no
// heartbeat; it does not mark live nodes lost before their next heartbeat
// could arrive, even though their records' leases are long past.
func TestRestartGrantsGraceLease(t *testing.T) {
	const hb = 200 * time.Millisecond
	cfg := controlplane.Config{HeartbeatInterval: hb, LeaseMultiplier: 3, ReconcileInterval: 50 * time.Millisecond, WaitForCapacity: true, OpenEnrollment: true}
	pl := startTestPlane(t, cfg)
	enr := pl.enroll(t, "n1")
	pl.stop()
	time.Sleep(1 * time.Second) // the record's lease (600 ms) lapses meanwhile
	pl.start(t, cfg)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(hb / 2):
				pl.heartbeat(t, "n1", enr.FencingToken)
			}
		}
	}()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	<-done
	if rec, _ := pl.node(t, "n1"); rec.State != schemas.NodeReady {
		t.Fatalf("live node is %s after a control-plane restart", rec.State)
	}
	if n := pl.cp.Metrics().LeaseLapses; n != 0 {
		t.Fatalf("%d lease lapses after restart", n)
	}
}

// TestWaitingRunsIdleQuietly: Runs that wait for capacity get one decided
// event per distinct answer; later passes neither decide them again (their
// fleet is unchanged) nor write or publish anything. A node enrolling
// changes the fleet, and every waiting Run is then placed.
func TestWaitingRunsIdleQuietly(t *testing.T) {
	pl := startTestPlane(t, controlplane.Config{WaitForCapacity: true, ReconcileInterval: 20 * time.Millisecond, OpenEnrollment: true})
	const runs = 20
	for i := range runs {
		rid := fmt.Sprintf("idle-%d", i)
		pl.publish(t, bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), rid, testRequest(rid))
	}
	eventually(t, 30*time.Second, "every Run decided", func() bool {
		for i := range runs {
			r, ok := pl.run(t, schemas.RunIDFor(schemas.DefaultTenant, fmt.Sprintf("idle-%d", i)))
			if !ok || r.Waiting == "" {
				return false
			}
		}
		return true
	})
	// Each decision's event is published after the write that stored it.
	eventually(t, 30*time.Second, "every Run's events in WF_EVENTS", func() bool {
		for i := range runs {
			id := schemas.RunIDFor(schemas.DefaultTenant, fmt.Sprintf("idle-%d", i))
			if r, _ := pl.run(t, id); pl.storedEvents(t, id) < r.EventSeq {
				return false
			}
		}
		return true
	})
	// A few passes settle what the decisions started (about 200 ms' worth),
	// then the idle ones are counted.
	settled := pl.cp.Metrics().Passes
	eventually(t, 30*time.Second, "about 10 scheduling passes", func() bool { return pl.cp.Metrics().Passes-settled >= 10 })
	before := pl.cp.Metrics()
	var after controlplane.Metrics
	eventually(t, 30*time.Second, "about 25 scheduling passes", func() bool {
		after = pl.cp.Metrics()
		return after.Passes-before.Passes >= 25
	})
	if d := after.Decisions - before.Decisions; d != 0 {
		t.Fatalf("idle passes decided unchanged waiting Runs %d times", d)
	}
	if d := after.EventsPublished - before.EventsPublished; d != 0 {
		t.Fatalf("idle passes published %d events", d)
	}
	if d := after.Transitions - before.Transitions; d != 0 {
		t.Fatalf("idle passes wrote %d Run changes", d)
	}
	pl.enroll(t, "n1")
	eventually(t, 30*time.Second, "every waiting Run placed once a node enrolled", func() bool {
		for i := range runs {
			if r, _ := pl.run(t, schemas.RunIDFor(schemas.DefaultTenant, fmt.Sprintf("idle-%d", i))); r.NodeID != "n1" {
				return false
			}
		}
		return true
	})
}

// TestEventsSeenOnce: a subscriber on wf.events.> sees each event of a
// simple Run exactly once, from accepted to succeeded.
func TestEventsSeenOnce(t *testing.T) {
	pl := startTestPlane(t, controlplane.Config{HeartbeatInterval: time.Second, ReconcileInterval: 20 * time.Millisecond, OpenEnrollment: true})
	digest := "sha256:" + fmt.Sprintf("%064x", 1)
	rt := noopruntime.New(noopruntime.Options{Images: []string{digest}, ExitAfter: 300 * time.Millisecond})
	a, err := agent.New(agent.Config{NodeID: "n1", Generation: 1, DataDir: t.TempDir(), Capacity: schemas.Resources{CPUMillis: 4000, MemoryBytes: 4 << 30}},
		testenv.Dial(t, pl.url, "agent"), rt, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan struct{})
	go func() { defer close(adone); _ = a.Run(actx) }()
	t.Cleanup(func() { acancel(); <-adone })
	eventually(t, 30*time.Second, "agent enrolled", func() bool {
		return a.Enrollment().FencingToken != 0
	})

	var (
		mu   sync.Mutex
		seen []schemas.RunEvent
	)
	sub, err := pl.conn.NC.Subscribe(bus.SubjectEvents, func(m *nats.Msg) {
		var ev schemas.RunEvent
		if json.Unmarshal(m.Data, &ev) == nil {
			mu.Lock()
			seen = append(seen, ev)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = pl.conn.NC.Flush()

	pl.publish(t, bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), "once", testRequest("once"))
	runID := schemas.RunIDFor(schemas.DefaultTenant, "once")
	eventually(t, 30*time.Second, "Run succeeded", func() bool {
		r, ok := pl.run(t, runID)
		return ok && r.Phase == schemas.PhaseSucceeded
	})
	// The terminal event is published after the write that stored it: wait
	// until every event the record counts was seen, then give many
	// scheduling passes and late reports the time to repeat one.
	r, _ := pl.run(t, runID)
	seqs := func() []uint64 {
		mu.Lock()
		defer mu.Unlock()
		var out []uint64
		for _, ev := range seen {
			if ev.RunID == runID {
				out = append(out, ev.Seq)
			}
		}
		slices.Sort(out) // one Run's events come from intake, reconcile and ingest
		return out
	}
	eventually(t, 30*time.Second, "every event of the Run seen", func() bool {
		s := seqs()
		for seq := uint64(1); seq <= r.EventSeq; seq++ {
			if !slices.Contains(s, seq) {
				return false
			}
		}
		return true
	})
	time.Sleep(500 * time.Millisecond)
	got := seqs()
	mu.Lock()
	defer mu.Unlock()
	want := make([]uint64, r.EventSeq)
	for i := range want {
		want[i] = uint64(i + 1)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("subscriber saw event seqs %v, want each of 1..%d once: %+v", got, r.EventSeq, seen)
	}
}

// TestIntakeRecordsFirstDecision: while no node fits, intake stores a new
// Run with its first decision in the Create (one wf_runs revision, one
// accepted event carrying the decision), so the scheduler writes nothing
// more. Once a node that fits enrolls, intake decides nothing and the
// scheduler books it.
func TestIntakeRecordsFirstDecision(t *testing.T) {
	pl := startTestPlane(t, controlplane.Config{WaitForCapacity: true, ReconcileInterval: 20 * time.Millisecond, OpenEnrollment: true})
	kv, err := pl.conn.JS.KeyValue(context.Background(), bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		events = map[string][]schemas.RunEvent{}
	)
	sub, err := pl.conn.NC.Subscribe(bus.SubjectEvents, func(m *nats.Msg) {
		var ev schemas.RunEvent
		if json.Unmarshal(m.Data, &ev) == nil {
			mu.Lock()
			events[ev.RunID] = append(events[ev.RunID], ev)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = pl.conn.NC.Flush()
	decided := func(id string) bool {
		r, ok := pl.run(t, id)
		return ok && r.Waiting != ""
	}

	const runs = 10
	for i := range runs {
		rid := fmt.Sprintf("early-%d", i)
		pl.publish(t, bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), rid, testRequest(rid))
	}
	for i := range runs {
		id := schemas.RunIDFor(schemas.DefaultTenant, fmt.Sprintf("early-%d", i))
		// The events follow the Create that stores them both.
		var evs []schemas.RunEvent
		eventually(t, 10*time.Second, id+" decided and its events seen", func() bool {
			mu.Lock()
			evs = slices.Clone(events[id])
			mu.Unlock()
			return decided(id) && len(evs) >= 1
		})
		hist, err := kv.History(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if len(hist) != 1 || len(evs) != 1 || evs[0].Type != schemas.EventAccepted || !evs[0].Decided() || evs[0].Code != schemas.CodeNoCapacity ||
			evs[0].Decision.RunID != id || len(evs[0].Decision.Candidates) != 0 {
			t.Fatalf("%s: %d wf_runs revisions and events %+v; want one revision and one accepted event carrying the no_capacity decision", id, len(hist), evs)
		}
	}

	pl.enroll(t, "n1")
	pl.publish(t, bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), "fits", testRequest("fits"))
	id := schemas.RunIDFor(schemas.DefaultTenant, "fits")
	eventually(t, 10*time.Second, "Run booked on n1", func() bool {
		r, ok := pl.run(t, id)
		return ok && r.NodeID == "n1"
	})
	mu.Lock()
	defer mu.Unlock()
	for _, ev := range events[id] {
		if ev.Code == schemas.CodeNoCapacity {
			t.Fatalf("a Run that fits was recorded as waiting: %+v", events[id])
		}
	}
}

// TestStoredDecisionIsCompacted: a decision over more nodes than
// DecisionCandidates is stored with that many full entries (the winner and
// the cheapest loser) and every other node named under its reason, so each rejected node is still recorded
// (invariant 4) while a Run's record stays small on a large fleet.
func TestStoredDecisionIsCompacted(t *testing.T) {
	pl := startTestPlane(t, controlplane.Config{WaitForCapacity: true, ReconcileInterval: 20 * time.Millisecond, OpenEnrollment: true, DecisionCandidates: 2})
	const nodes = 5
	for i := range nodes {
		pl.enroll(t, fmt.Sprintf("n%d", i))
	}
	pl.publish(t, bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), "big", testRequest("big"))
	id := schemas.RunIDFor(schemas.DefaultTenant, "big")
	var d *schemas.BookingDecision
	eventually(t, 10*time.Second, "decision stored", func() bool {
		r, ok := pl.run(t, id)
		if !ok {
			return false
		}
		for _, ev := range r.Outbox {
			if ev.Decision != nil {
				d = ev.Decision
			}
		}
		return d != nil
	})
	named := map[string]bool{}
	for _, c := range d.Candidates {
		named[c.NodeID] = c.Reason != "" || c.NodeID == d.Winner
	}
	for reason, ids := range d.Others {
		for _, id := range ids {
			named[id] = reason != ""
		}
	}
	if len(d.Candidates) != 2 || len(named) != nodes {
		t.Fatalf("decision kept %d full entries and names %d nodes; want 2 and %d: %+v", len(d.Candidates), len(named), nodes, d)
	}
	for id, hasReason := range named {
		if !hasReason {
			t.Fatalf("%s recorded without a reason: %+v", id, d)
		}
	}
}
