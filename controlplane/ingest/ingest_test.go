package ingest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// facts records what RecordFacts was given; fail makes it refuse.
type facts struct {
	mu     sync.Mutex
	byNode map[string][]uint64 // the tokens each node's facts came under
	fail   error
}

func (f *facts) RecordFacts(_ context.Context, nodeID string, token uint64, _ schemas.NodeFacts) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.byNode[nodeID] = append(f.byNode[nodeID], token)
	return nil
}

func (f *facts) failWith(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *facts) of(nodeID string) []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byNode[nodeID]
}

// prefetches records the receipts and progress handed over.
type prefetches struct {
	mu       sync.Mutex
	receipts []schemas.OperationReceipt
	progress []schemas.ImageProgress
}

func (p *prefetches) Progress(_ string, pr schemas.ImageProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.progress = append(p.progress, pr)
}

func (p *prefetches) Receipt(_ context.Context, _ string, rc schemas.OperationReceipt) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.receipts = append(p.receipts, rc)
	return nil
}

// env is an Ingest over an embedded NATS with two enrolled nodes: n1 in
// session 3 and n2 in session 5.
type env struct {
	t        *testing.T
	ctx      context.Context
	conn     *bus.Conn
	cache    *cache.Cache
	store    *runs.Store
	ingest   *Ingest
	facts    *facts
	prefetch *prefetches
	obs      jetstream.Consumer
	nodesKV  jetstream.KeyValue
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	conn := testenv.ProvisionedBus(t, "ingest-test")
	kv, err := conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := conn.JS.CreateOrUpdateConsumer(ctx, bus.StreamObs, bus.ObsConsumerConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := cache.New()
	for _, n := range []schemas.NodeRecord{
		{NodeID: "n1", FencingToken: 3, Generation: 1, State: schemas.NodeReady},
		{NodeID: "n2", FencingToken: 5, Generation: 1, State: schemas.NodeReady},
	} {
		c.NoteNode(n, 0) // below any wf_nodes revision: a record read from the bucket is newer
	}
	store := runs.NewStore(kv, conn.JS, c, runs.Config{DecisionCandidates: 8, MaxAttempts: 3, Poke: func() {}, Now: time.Now}, zap.NewNop())
	e := &env{t: t, ctx: ctx, conn: conn, cache: c, store: store, facts: &facts{byNode: map[string][]uint64{}}, prefetch: &prefetches{}, obs: obs}
	nodesKV, err := conn.JS.KeyValue(ctx, bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	e.nodesKV = nodesKV
	e.ingest = New(c, nodesKV, store, dispatch.New(conn.JS, c, time.Now, zap.NewNop()), e.facts, e.prefetch, time.Now, zap.NewNop())
	return e
}

// booked creates a Run and books its first attempt on node n1.
func (e *env) booked(requestID string) schemas.Run {
	e.t.Helper()
	r, _, err := e.store.Create(e.ctx, schemas.DefaultTenant, bus.OperatorUser, schemas.RunRequest{RequestID: requestID}, nil, runs.Policy{}, func(schemas.Run) lifecycle.Transition { return nil })
	if err != nil {
		e.t.Fatal(err)
	}
	r, err = e.store.Advance(e.ctx, r.ID, lifecycle.Placement{NodeID: "n1", FencingToken: 3, Generation: 1}, false)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

func (e *env) stored(id string) schemas.Run {
	e.t.Helper()
	r, found, err := e.store.Stored(e.ctx, id)
	if err != nil || !found {
		e.t.Fatalf("run %s: found %v, %v", id, found, err)
	}
	return r
}

// publish puts data on subject in WF_OBS, as an agent does.
func (e *env) publish(subject string, data []byte) {
	e.t.Helper()
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
	if _, err := e.conn.JS.PublishMsg(e.ctx, m); err != nil {
		e.t.Fatal(err)
	}
}

// handle delivers the next WF_OBS message to Ingest.Handle, as the
// control plane's consumer does, and returns how often it was delivered.
func (e *env) handle() uint64 {
	e.t.Helper()
	batch, err := e.obs.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		e.t.Fatal(err)
	}
	for m := range batch.Messages() {
		meta, err := m.Metadata()
		if err != nil {
			e.t.Fatal(err)
		}
		e.ingest.Handle(e.ctx, m, meta.NumDelivered > 1)
		return meta.NumDelivered
	}
	e.t.Fatalf("no observation to handle: %v", batch.Error())
	return 0
}

// observe publishes o on subject and handles it.
func (e *env) observe(subject string, o schemas.Observation) {
	e.t.Helper()
	b, err := codec.Encode(codec.JSON, o)
	if err != nil {
		e.t.Fatal(err)
	}
	e.publish(subject, b)
	e.handle()
}

// settled is the consumer's state once the server holds every
// acknowledgement sent (they are not awaited), or after 10s.
func (e *env) settled() *jetstream.ConsumerInfo {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := e.obs.Info(e.ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		if info.NumAckPending == 0 || time.Now().After(deadline) {
			return info
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func workload(nodeID string, token uint64, r schemas.Run, phase schemas.WorkloadPhase) schemas.Observation {
	return schemas.Observation{NodeID: nodeID, FencingToken: token, Generation: 1, Kind: schemas.ObsWorkload,
		Workload: &schemas.WorkloadObservation{RunID: r.ID, AttemptID: r.AttemptID, Phase: phase, ObservedAt: time.Now()}}
}

// lastCommand is the last command sent to node, or nil.
func (e *env) lastCommand(node string) *schemas.Command {
	e.t.Helper()
	stream, err := e.conn.JS.Stream(e.ctx, bus.StreamCmds)
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(e.ctx, bus.NodeCmd(node))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	var c schemas.Command
	if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &c); err != nil {
		e.t.Fatal(err)
	}
	return &c
}

// A report is applied only from the node it names, on that node's own
// subject, under its current session; anything else is dropped, counted,
// and acknowledged, never applied late.
func TestFencing(t *testing.T) {
	e := newEnv(t)
	r := e.booked("fenced")
	for _, tc := range []struct {
		name    string
		subject string
		obs     schemas.Observation
	}{
		{"on another node's subject", bus.NodeObs("n2"), workload("n1", 3, r, schemas.WorkloadRunning)},
		{"from a node not enrolled", bus.NodeObs("n9"), workload("n9", 1, r, schemas.WorkloadRunning)},
		{"from a superseded session", bus.NodeObs("n1"), workload("n1", 2, r, schemas.WorkloadRunning)},
		{"facts from a superseded session", bus.NodeObs("n1"), schemas.Observation{NodeID: "n1", FencingToken: 2, Kind: schemas.ObsFacts, Facts: &schemas.NodeFacts{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fenced := e.ingest.Fenced()
			e.observe(tc.subject, tc.obs)
			if got := e.ingest.Fenced() - fenced; got != 1 {
				t.Errorf("fenced %d reports, want 1", got)
			}
			if got := e.stored(r.ID); got.Phase != schemas.PhasePlaced || got.EventSeq != r.EventSeq {
				t.Errorf("a fenced report moved the Run: %s, event %d", got.Phase, got.EventSeq)
			}
			if len(e.facts.of("n1")) != 0 {
				t.Errorf("fenced facts were recorded: %v", e.facts.of("n1"))
			}
		})
	}
	// The same report from the current session is applied.
	e.observe(bus.NodeObs("n1"), workload("n1", 3, r, schemas.WorkloadRunning))
	if got := e.stored(r.ID); got.Phase != schemas.PhaseRunning {
		t.Fatalf("the current session's report was not applied: %s", got.Phase)
	}
	if info := e.settled(); info.NumAckPending != 0 || info.NumRedelivered != 0 {
		t.Errorf("every report acknowledged once: %d waiting for an ack, %d redelivered", info.NumAckPending, info.NumRedelivered)
	}
}

// A node's current session reporting on an attempt booked on another node
// is refused (counted under attempt_not_booked_here): the Run does not
// move, and the attempt, since that node says it runs it, is stopped there.
func TestReportForAnotherNodesAttempt(t *testing.T) {
	e := newEnv(t)
	r := e.booked("elsewhere")
	fenced := e.ingest.Fenced()
	e.observe(bus.NodeObs("n2"), workload("n2", 5, r, schemas.WorkloadRunning))
	if got := e.stored(r.ID); got.Phase != schemas.PhasePlaced || got.NodeID != "n1" {
		t.Fatalf("n2's report moved a Run booked on n1: %s on %s", got.Phase, got.NodeID)
	}
	if e.ingest.Fenced() != fenced {
		t.Errorf("a current session's report was counted as fenced")
	}
	if e.ingest.Refused() != 1 {
		t.Errorf("refused %d reports, want 1", e.ingest.Refused())
	}
	stop := e.lastCommand("n2")
	if stop == nil || stop.Kind != schemas.CmdStopWorkload || stop.FencingToken != 5 || stop.Stop.AttemptID != r.AttemptID || stop.Stop.Reason != "attempt not booked on this node" {
		t.Fatalf("n2 was not told to stop the attempt: %+v", stop)
	}
	if c := e.lastCommand("n1"); c != nil {
		t.Errorf("n1, where the attempt is booked, got %s", c.Kind)
	}
	// A report that the attempt is over, from n2, needs no stop.
	exited := workload("n2", 5, r, schemas.WorkloadExited)
	one := 1
	exited.Workload.ExitCode = &one
	e.observe(bus.NodeObs("n2"), exited)
	if got := e.stored(r.ID); got.Phase != schemas.PhasePlaced || got.ExitCode != nil {
		t.Errorf("n2's exit report moved the Run: %s", got.Phase)
	}
	if e.ingest.Refused() != 2 {
		t.Errorf("refused %d reports, want 2", e.ingest.Refused())
	}
}

// A failed receipt from a node's current session about an attempt booked
// on another node is refused: the Run stays as it is, and the same receipt
// from the booked node fails it.
func TestReceiptForAnotherNodesAttempt(t *testing.T) {
	e := newEnv(t)
	r := e.booked("receipt elsewhere")
	rc := schemas.OperationReceipt{OperationID: dispatch.OpID(r.AttemptID, "launch"), Kind: schemas.CmdLaunchWorkload, RunID: r.ID, AttemptID: r.AttemptID,
		AcceptedAt: time.Now(), Outcome: schemas.OutcomeFailed, Code: schemas.CodeLaunchFailed, Message: "forged"}
	e.observe(bus.NodeObs("n2"), schemas.Observation{NodeID: "n2", FencingToken: 5, Generation: 1, Kind: schemas.ObsReceipt, Receipt: &rc})
	if got := e.stored(r.ID); got.Phase != schemas.PhasePlaced || got.NodeID != "n1" || got.EventSeq != r.EventSeq {
		t.Fatalf("n2's receipt moved a Run booked on n1: %s on %s, event %d", got.Phase, got.NodeID, got.EventSeq)
	}
	if e.ingest.Refused() != 1 {
		t.Errorf("refused %d receipts, want 1", e.ingest.Refused())
	}
	e.observe(bus.NodeObs("n1"), schemas.Observation{NodeID: "n1", FencingToken: 3, Generation: 1, Kind: schemas.ObsReceipt, Receipt: &rc})
	if got := e.stored(r.ID); got.Phase != schemas.PhaseFailed {
		t.Errorf("the booked node's receipt: %s, want failed", got.Phase)
	}
}

// A report under a newer session than this replica's cache holds (another
// replica enrolled the node again, and this one's watch has not caught up)
// is judged by the current record in wf_nodes: applied when the record says
// it is the current session, never acknowledged and dropped. The cache
// learns the record.
func TestFencingReadsCurrentRecord(t *testing.T) {
	e := newEnv(t)
	r := e.booked("re-enrolled")
	e.observe(bus.NodeObs("n1"), workload("n1", 3, r, schemas.WorkloadRunning))
	// Another replica re-enrolled n1 under session 4; this cache still says 3.
	if _, err := bus.CreateJSON(e.ctx, e.nodesKV, "n1", schemas.NodeRecord{NodeID: "n1", FencingToken: 4, Generation: 1, State: schemas.NodeReady}); err != nil {
		t.Fatal(err)
	}
	fenced := e.ingest.Fenced()
	exited := workload("n1", 4, r, schemas.WorkloadExited)
	seven := 7
	exited.Workload.ExitCode = &seven
	e.observe(bus.NodeObs("n1"), exited)
	got := e.stored(r.ID)
	if got.Phase != schemas.PhaseFailed || got.ExitCode == nil || *got.ExitCode != 7 {
		t.Fatalf("the new session's exit report: %s, exit %v; want failed with 7", got.Phase, got.ExitCode)
	}
	if e.ingest.Fenced() != fenced {
		t.Errorf("the current session's report was counted as fenced")
	}
	if n, _ := e.cache.Node("n1"); n.FencingToken != 4 {
		t.Errorf("cache still holds session %d", n.FencingToken)
	}
	// The old session is now fenced by the cache alone.
	e.observe(bus.NodeObs("n1"), workload("n1", 3, r, schemas.WorkloadRunning))
	if e.ingest.Fenced() != fenced+1 {
		t.Errorf("the superseded session's report was not fenced")
	}
	// A token newer than the current record too is dropped.
	e.observe(bus.NodeObs("n1"), workload("n1", 9, r, schemas.WorkloadRunning))
	if e.ingest.Fenced() != fenced+2 {
		t.Errorf("a token newer than the record was not fenced")
	}
	if info := e.settled(); info.NumAckPending != 0 || info.NumRedelivered != 0 {
		t.Errorf("every report acknowledged once: %d waiting for an ack, %d redelivered", info.NumAckPending, info.NumRedelivered)
	}
}

// A report the cache cannot vouch for, when wf_nodes cannot be read, is
// left for redelivery, never acknowledged and dropped.
func TestFencingStoreUnreadable(t *testing.T) {
	e := newEnv(t)
	r := e.booked("unreadable")
	if err := e.conn.JS.DeleteKeyValue(e.ctx, bus.BucketNodes); err != nil {
		t.Fatal(err)
	}
	e.publish(bus.NodeObs("n1"), mustJSON(t, workload("n1", 4, r, schemas.WorkloadRunning)))
	if n := e.handle(); n != 1 {
		t.Fatalf("first delivery is %d", n)
	}
	if n := e.handle(); n != 2 {
		t.Fatalf("the report was not redelivered: delivery %d", n)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := codec.Encode(codec.JSON, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Reports move the Run forward; one naming a phase the Run has passed is
// counted stale and changes nothing; a Run the control plane does not know
// is stopped on the node that runs it.
func TestWorkloadReports(t *testing.T) {
	e := newEnv(t)
	r := e.booked("reports")
	e.observe(bus.NodeObs("n1"), workload("n1", 3, r, schemas.WorkloadPreparing))
	if got := e.stored(r.ID); got.Phase != schemas.PhasePreparing {
		t.Fatalf("after preparing: %s", got.Phase)
	}
	e.observe(bus.NodeObs("n1"), workload("n1", 3, r, schemas.WorkloadRunning))
	stale := e.ingest.Stale()
	e.observe(bus.NodeObs("n1"), workload("n1", 3, r, schemas.WorkloadPreparing))
	if got := e.stored(r.ID); got.Phase != schemas.PhaseRunning || e.ingest.Stale() != stale+1 {
		t.Fatalf("a late preparing report: phase %s, stale %d (was %d)", got.Phase, e.ingest.Stale(), stale)
	}
	exited := workload("n1", 3, r, schemas.WorkloadExited)
	zero := 0
	exited.Workload.ExitCode = &zero
	e.observe(bus.NodeObs("n1"), exited)
	if got := e.stored(r.ID); got.Phase != schemas.PhaseSucceeded || got.ExitCode == nil || *got.ExitCode != 0 {
		t.Fatalf("after exit 0: %s %v", got.Phase, got.ExitCode)
	}

	ghost := schemas.Run{ID: "r-ghost", AttemptID: schemas.WorkloadID("r-ghost", 1)}
	e.observe(bus.NodeObs("n1"), workload("n1", 3, ghost, schemas.WorkloadRunning))
	if stop := e.lastCommand("n1"); stop == nil || stop.Kind != schemas.CmdStopWorkload || stop.Stop.RunID != ghost.ID || stop.Stop.Reason != "unknown to the control plane" {
		t.Fatalf("an unknown Run's workload was not stopped: %+v", stop)
	}
}

// A receipt fails the Run only when its command failed for a reason a
// resend will not mend; a prefetch's receipt goes to the prefetches.
func TestReceipts(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name     string
		kind     schemas.CommandKind
		outcome  string
		code     schemas.Code
		prefetch string
		want     schemas.Phase
	}{
		{"applied", schemas.CmdLaunchWorkload, schemas.OutcomeApplied, "", "", schemas.PhasePlaced},
		{"refused for a stale session", schemas.CmdLaunchWorkload, schemas.OutcomeRefused, schemas.CodeStaleFencingToken, "", schemas.PhasePlaced},
		{"refused for a stale generation", schemas.CmdPrepareImage, schemas.OutcomeRefused, schemas.CodeStaleGeneration, "", schemas.PhasePlaced},
		{"a stop that failed", schemas.CmdStopWorkload, schemas.OutcomeFailed, schemas.CodeLaunchFailed, "", schemas.PhasePlaced},
		{"a launch that failed", schemas.CmdLaunchWorkload, schemas.OutcomeFailed, schemas.CodeLaunchFailed, "", schemas.PhaseFailed},
		{"a pull refused by the registry", schemas.CmdPrepareImage, schemas.OutcomeFailed, schemas.CodeRegistryAuthFailed, "", schemas.PhaseFailed},
		{"a prefetch's", schemas.CmdPrepareImage, schemas.OutcomeFailed, schemas.CodeLaunchFailed, "pf-1", schemas.PhasePlaced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.booked("receipt " + tc.name)
			handed := len(e.prefetch.receipts)
			rc := schemas.OperationReceipt{OperationID: dispatch.OpID(r.AttemptID, "x"), Kind: tc.kind, RunID: r.ID, AttemptID: r.AttemptID,
				PrefetchID: tc.prefetch, AcceptedAt: time.Now(), Outcome: tc.outcome, Code: tc.code, Message: "from the test"}
			e.observe(bus.NodeObs("n1"), schemas.Observation{NodeID: "n1", FencingToken: 3, Generation: 1, Kind: schemas.ObsReceipt, Receipt: &rc})
			got := e.stored(r.ID)
			if got.Phase != tc.want {
				t.Fatalf("phase %s, want %s", got.Phase, tc.want)
			}
			if tc.want == schemas.PhaseFailed && got.Reason != string(tc.code) {
				t.Errorf("failed for %q, want %s", got.Reason, tc.code)
			}
			if wantHanded := tc.prefetch != ""; (len(e.prefetch.receipts) > handed) != wantHanded {
				t.Errorf("handed to the prefetches: %v, want %v", len(e.prefetch.receipts) > handed, wantHanded)
			}
		})
	}
}

// A node's full account moves what it runs, ends the attempts it applied a
// launch for but no longer holds, and records its facts under its session.
func TestReconciliation(t *testing.T) {
	e := newEnv(t)
	gone, running, unlaunched := e.booked("gone"), e.booked("running"), e.booked("unlaunched")
	w := workload("n1", 3, running, schemas.WorkloadRunning).Workload
	rec := schemas.Reconciliation{NodeID: "n1", Generation: 1, FencingToken: 3,
		AppliedOperationIDs: []string{dispatch.OpID(gone.AttemptID, "launch"), dispatch.OpID(running.AttemptID, "launch")},
		Workloads:           []schemas.WorkloadObservation{*w}}
	e.observe(bus.NodeObs("n1"), schemas.Observation{NodeID: "n1", FencingToken: 3, Generation: 1, Kind: schemas.ObsReconciliation, Reconciliation: &rec})
	if got := e.stored(gone.ID); got.Phase != schemas.PhaseAccepted || got.NodeID != "" || got.Reason != string(schemas.CodeNodeLost) {
		t.Errorf("a launched workload the node no longer holds: %s on %q (%s)", got.Phase, got.NodeID, got.Reason)
	}
	if got := e.stored(running.ID); got.Phase != schemas.PhaseRunning {
		t.Errorf("a workload the node runs: %s", got.Phase)
	}
	if got := e.stored(unlaunched.ID); got.Phase != schemas.PhasePlaced {
		t.Errorf("a Run whose launch the node never applied: %s", got.Phase)
	}
	if got := e.facts.of("n1"); len(got) != 1 || got[0] != 3 {
		t.Errorf("facts recorded under sessions %v, want [3]", got)
	}
}

// A malformed report is terminated, never redelivered; one that cannot be
// applied now is redelivered, marked so.
func TestHandleAcknowledgement(t *testing.T) {
	e := newEnv(t)
	e.publish(bus.NodeObs("n1"), []byte(`{"node_id":"n1","kind":"workload"}`))
	e.handle()
	e.facts.failWith(errors.New("wf_nodes unavailable"))
	b, err := codec.Encode(codec.JSON, schemas.Observation{NodeID: "n1", FencingToken: 3, Kind: schemas.ObsFacts, Facts: &schemas.NodeFacts{}})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(bus.NodeObs("n1"), b)
	if n := e.handle(); n != 1 {
		t.Fatalf("the facts were delivered %d times before", n)
	}
	e.facts.failWith(nil)
	// The next delivery is the facts again, not the malformed report.
	if n := e.handle(); n != 2 {
		t.Fatalf("next delivery is a report's delivery %d, want the facts' second", n)
	}
	if got := e.facts.of("n1"); len(got) != 1 {
		t.Errorf("facts recorded %d times, want once", len(got))
	}
	if info := e.settled(); info.NumAckPending != 0 || info.NumPending != 0 {
		t.Errorf("consumer after both: %d waiting for an ack, %d pending", info.NumAckPending, info.NumPending)
	}
}
