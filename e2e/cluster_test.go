package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/adapters/capacity/fake"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// runWatch follows every revision of wf_runs and checks, as they arrive,
// that no key's revision goes backwards and that a Run that reached a
// terminal phase never moves again.
type runWatch struct {
	mu        sync.Mutex
	rev       map[string]uint64
	phase     map[string]schemas.Phase
	terminals map[string]int
	problems  []string
}

func (w *runWatch) note(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		w.mu.Lock()
		w.problems = append(w.problems, fmt.Sprintf("%s: %s at revision %d", e.Key(), e.Operation(), e.Revision()))
		w.mu.Unlock()
		return
	}
	var r schemas.Run
	if err := codec.Decode(codec.Detect(nil, e.Value()), e.Value(), &r); err != nil {
		w.mu.Lock()
		w.problems = append(w.problems, fmt.Sprintf("%s: undecodable at revision %d: %v", e.Key(), e.Revision(), err))
		w.mu.Unlock()
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	last, seen := w.rev[e.Key()]
	switch {
	case seen && e.Revision() < last:
		w.problems = append(w.problems, fmt.Sprintf("%s: revision %d after %d", e.Key(), e.Revision(), last))
		return
	case seen && e.Revision() == last:
		return // the same entry again (a watcher resumed after a failover)
	}
	w.rev[e.Key()] = e.Revision()
	prev := w.phase[e.Key()]
	if prev.Terminal() && r.Phase != prev {
		w.problems = append(w.problems, fmt.Sprintf("%s: %s after terminal %s (revision %d)", e.Key(), r.Phase, prev, e.Revision()))
	}
	if r.Phase.Terminal() && !prev.Terminal() {
		w.terminals[e.Key()]++
	}
	w.phase[e.Key()] = r.Phase
}

func (w *runWatch) done(ids []string) (terminal int, phases map[schemas.Phase]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	phases = map[schemas.Phase]int{}
	for _, id := range ids {
		p := w.phase[id]
		phases[p]++
		if p.Terminal() {
			terminal++
		}
	}
	return terminal, phases
}

// TestAcceptance_ClusterFailover: a 3-node JetStream cluster (every stream
// and bucket R3), two control-plane replicas and two agents. In the middle
// of 200 Runs one NATS node and one control-plane replica stop. Every Run
// still reaches a terminal phase, exactly once, succeeded; no revision of a
// Run in wf_runs goes backwards and no terminal Run moves again; every Run's
// event log holds exactly one terminal phase event.
func TestAcceptance_ClusterFailover(t *testing.T) {
	const runs = 200
	c := testenv.StartCluster(t, 3)
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	cfg := cpConfig()
	cfg.Topology = bus.Topology{Replicas: 3}

	provider, err := fake.New(fake.Config{Seed: 3, Clock: fake.NewManualClock(time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	// Each replica and agent dials a different node first.
	connect := func(i int, name string) *bus.Conn {
		conn, err := bus.Connect(c.URLsFrom(i), name, log.Named(name), nats.DontRandomize())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		return conn
	}
	startCP := func(i int) (*part, *bus.Conn) {
		ctx, cancel := context.WithCancel(context.Background())
		conn := connect(i, fmt.Sprintf("cp-%d", i))
		cfg := cfg
		// Both replicas may rent; one at a time leads the rental loop.
		cfg.Capacity = &rentals.Config{Provider: provider, OwnershipToken: "wf-cluster", Interval: 200 * time.Millisecond, LeaderTTL: 3 * time.Second}
		cp, err := controlplane.New(ctx, conn, cfg, log.Named(fmt.Sprintf("cp-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		p := newPart(cancel, func() error { return cp.Run(ctx) })
		select {
		case <-cp.Ready():
		case <-time.After(30 * time.Second):
			t.Fatalf("control plane %d not ready", i)
		}
		t.Cleanup(func() { p.stop(t) })
		return p, conn
	}
	cp0, cp0conn := startCP(0)
	_, _ = startCP(1)

	digest := "sha256:" + fmt.Sprintf("%064x", 42)
	for i := range 2 {
		id := fmt.Sprintf("cluster-node-%d", i)
		conn := connect(i+1, id)
		a, err := agent.New(agent.Config{NodeID: id, Generation: 1, DataDir: tempDir(t), StopGrace: time.Second,
			Capacity: schemas.Resources{CPUMillis: 64_000, MemoryBytes: 256 << 30}},
			conn, noopruntime.New(noopruntime.Options{Images: []string{digest}, ExitAfter: 300 * time.Millisecond}), log.Named(id))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		p := newPart(cancel, func() error { return a.Run(ctx) })
		t.Cleanup(func() { p.stop(t) })
	}

	prod := connect(2, "producer")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := prod.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	watch := &runWatch{rev: map[string]uint64{}, phase: map[string]schemas.Phase{}, terminals: map[string]int{}}
	watcher, err := kv.WatchAll(ctx, jetstream.IncludeHistory())
	if err != nil {
		t.Fatal(err)
	}
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for e := range watcher.Updates() {
			if e != nil {
				watch.note(e)
			}
		}
	}()
	defer func() { _ = watcher.Stop(); <-watchDone }()

	var ids []string
	submit := func(i int) {
		req := schemas.RunRequest{RequestID: fmt.Sprintf("cluster-%03d", i), Image: "localhost/cluster@" + digest, Command: []string{"true"}}
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, schemas.RunIDFor(schemas.DefaultTenant, req.RequestID))
		deadline := time.Now().Add(60 * time.Second)
		for {
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := prod.JS.PublishMsg(pctx, &nats.Msg{Subject: bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), Data: b}, jetstream.WithMsgID(req.RequestID))
			pcancel()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("submit %s: %v", req.RequestID, err)
			}
			time.Sleep(200 * time.Millisecond) // the same message id again: deduplicated
		}
	}
	for i := range runs {
		if i == runs/3 {
			n, _ := watch.done(ids)
			t.Logf("stopping NATS node wf-1 and control-plane replica cp-0 with %d of %d submitted Runs terminal", n, len(ids))
			c.Nodes[1].Stop()
			cp0conn.Close() // abruptly: its connection goes first
			cp0.stop(t)
		}
		submit(i)
	}

	deadline := time.Now().Add(3 * time.Minute)
	for {
		n, phases := watch.done(ids)
		if n == runs {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d Runs terminal after 3 minutes; phases %v", n, runs, phases)
		}
		time.Sleep(250 * time.Millisecond)
	}
	// A late duplicate would arrive after the last terminal write: give the
	// survivors a few scheduling passes to make one, if they were going to.
	time.Sleep(2 * time.Second)
	_, phases := watch.done(ids)
	watch.mu.Lock()
	problems := append([]string(nil), watch.problems...)
	for _, id := range ids {
		if n := watch.terminals[id]; n != 1 {
			problems = append(problems, fmt.Sprintf("%s reached a terminal phase %d times", id, n))
		}
	}
	watch.mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	if phases[schemas.PhaseSucceeded] != runs {
		t.Errorf("phases %v; want all %d succeeded", phases, runs)
	}

	// The surviving replica leads the rental loop.
	leases, err := prod.JS.KeyValue(ctx, bus.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t}
	f.eventually(30*time.Second, "a live rental-loop leader after the failover", func() bool {
		var rec struct {
			Holder    string    `json:"holder"`
			Term      uint64    `json:"term"`
			ExpiresAt time.Time `json:"expires_at"`
		}
		_, err := bus.GetJSON(ctx, leases, rentals.LeaderKey, &rec)
		return err == nil && rec.Holder != "" && rec.Term >= 1 && time.Now().Before(rec.ExpiresAt)
	})

	// The audit log: exactly one terminal phase event per Run. A Run's
	// terminal write is stored before its event is published (by the
	// replica that wrote it, or by the survivor's outbox repair), so the log
	// is read until it holds one for every Run.
	var terminalEvents map[string]int
	f.eventually(2*time.Minute, "a terminal phase event of every Run in WF_EVENTS", func() bool {
		terminalEvents = countTerminalEvents(ctx, t, prod.JS)
		for _, id := range ids {
			if terminalEvents[id] == 0 {
				return false
			}
		}
		return true
	})
	for _, id := range ids {
		if n := terminalEvents[id]; n != 1 {
			t.Errorf("%s has %d terminal phase events", id, n)
		}
	}
}

// countTerminalEvents counts the terminal phase events WF_EVENTS holds, by
// Run, reading through a cluster that may still be electing leaders.
func countTerminalEvents(ctx context.Context, t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	var (
		stream jetstream.Stream
		info   *jetstream.StreamInfo
		err    error
	)
	for try := 0; ; try++ {
		if stream, err = js.Stream(ctx, bus.StreamEvents); err == nil {
			if info, err = stream.Info(ctx); err == nil {
				break
			}
		}
		if try == 50 {
			t.Fatalf("events stream: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	counts := map[string]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		var m *jetstream.RawStreamMsg
		for try := 0; ; try++ {
			if m, err = stream.GetMsg(ctx, seq); err == nil || try == 20 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("event %d: %v", seq, err)
		}
		var ev schemas.RunEvent
		if codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &ev) == nil && ev.Type == schemas.EventPhase && ev.Phase.Terminal() {
			counts[ev.RunID]++
		}
	}
	return counts
}
