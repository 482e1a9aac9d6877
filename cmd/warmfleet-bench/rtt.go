package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

type rttOpts struct {
	samples int
	warmup  int
	runs    int
	pace    time.Duration
	stops   bool
}

// sampling is how many round trips a measurement times, and the pause
// before each one: none sends them back to back.
type sampling struct {
	warmup, samples int
	pace            time.Duration
}

// roundTrip times one round trip of one kind; i numbers the sample.
type roundTrip struct {
	name string
	once func(ctx context.Context, i int) (time.Duration, error)
}

// interleave takes the kinds in turn within each sample, rotating which
// goes first, so that all of them see the same machine: on a shared host
// the load drifts within seconds, and a baseline timed a few seconds
// before its subject is not a same-run baseline.
func interleave(ctx context.Context, sm sampling, rts ...roundTrip) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(rts))
	for i := range sm.warmup + sm.samples {
		for j := range rts {
			k := (i + j) % len(rts)
			if sm.pace > 0 {
				time.Sleep(sm.pace)
			}
			d, err := rts[k].once(ctx, i)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", rts[k].name, err)
			}
			if i >= sm.warmup {
				out[k] = append(out[k], d)
			}
		}
	}
	return out, nil
}

func newRTTCmd(g *globals) *cobra.Command {
	o := rttOpts{}
	cmd := &cobra.Command{
		Use:   "rtt",
		Short: "Command round trip (control plane → agent → receipt) vs core NATS request/reply",
		Long: `rtt times the command path with a real agent (agent.Agent, its journal
included) over the no-op runtime (internal/noopruntime), so only warmfleet
and NATS are measured.

Command round trip: the bench publishes a PrepareImage command on
wf.node.<id>.cmd into WF_CMDS exactly as the control plane's dispatch does
(msgpack, Nats-Msg-Id <op>:<token>, the node's current fencing token and
generation) and times until the agent's receipt for that operation id is
published on wf.node.<id>.obs. One command is in flight at a time. The
prepare names no Run, so the agent sends the receipt and no workload
report; the image is held, so the runtime returns at once. The path is: JetStream
store, pull delivery to the agent, decode, fencing checks, journal lookup,
EnsureImage, journal append (a prepare is acked without waiting for an
fsync), receipt publish-with-ack into WF_OBS.

Stops (--stops): in a second pass, StopWorkload commands for attempts the
node never launched, timed the same way against the floor: their journal
entry is synced before the ack, and the agent reports the attempt failed
before it sends the receipt.

Baseline: core NATS request/reply of the same payload size on the same
server, one in flight.

The baseline, the commands and the floor are timed in turn within each
sample (the order rotating), so all three see the same machine; --pace
pauses before each, as sporadic commands arrive, instead of sending them
back to back.

Floor: the same round trip through JetStream with no warmfleet code — a
publish-with-ack into a stream configured as WF_CMDS, a consumer configured
as a node's, the receipt published with ack into a stream configured as
WF_OBS, then the ack. It is what two JetStream hops cost here; the round
trip over it is what the agent adds.

Also: submit → running for whole Runs on the same agent (placement, two
commands, four reports, every CAS), from the Run's events.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := runRTT(cmd.Context(), g, o)
			if err != nil {
				return err
			}
			return rep.print(cmd.OutOrStdout(), g.output)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.samples, "samples", 2000, "commands (and requests) timed")
	f.IntVar(&o.warmup, "warmup", 100, "untimed commands (and requests) first")
	f.IntVar(&o.runs, "runs", 100, "whole Runs timed submit → running (0 skips)")
	f.BoolVar(&o.stops, "stops", true, "also time stop commands, whose journal entry is synced before the ack, in a second pass with their own floor")
	f.DurationVar(&o.pace, "pace", 0, "pause before each timed command, request and floor round trip (0: back to back), as sporadic commands arrive")
	return cmd
}

func runRTT(ctx context.Context, g *globals, o rttOpts) (*Report, error) {
	prof, err := newProfiler(g.cpuProfile)
	if err != nil {
		return nil, err
	}
	defer prof.close()
	e, err := newEnv(g, "rtt")
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := e.startCP(controlplane.Config{HeartbeatInterval: time.Second, OpenEnrollment: true}); err != nil {
		return nil, err
	}
	const nodeID = "bench-node-1"
	digest := benchDigest("rtt")
	ag, stopAgent, err := startNoopAgent(e, nodeID, noopruntime.Options{Images: []string{digest}, ExitAfter: 20 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	defer stopAgent()
	client, err := e.connect("bench-client")
	if err != nil {
		return nil, err
	}
	enr := ag.Enrollment()

	sample := rttCommand(nodeID, enr, "bench-rtt-sample-000000", digest)
	cmdBytes, err := codec.Encode(codec.MsgPack, sample)
	if err != nil {
		return nil, err
	}
	if err := prof.start(); err != nil {
		return nil, err
	}
	// Baseline: core request/reply, same payload size, same server; the
	// floor: the same trip through JetStream with no logic. Timed in turn
	// with the commands.
	base, err := requestReply(e, client, len(cmdBytes))
	if err != nil {
		return nil, fmt.Errorf("baseline: %w", err)
	}
	defer base.close()
	cmds, err := commandRTT(client, nodeID, enr, digest)
	if err != nil {
		return nil, err
	}
	defer cmds.close()
	floorRT, err := commandFloor(ctx, e, client, len(cmdBytes))
	if err != nil {
		return nil, err
	}
	defer floorRT.close()
	sm := sampling{warmup: o.warmup, samples: o.samples, pace: o.pace}
	lats, err := interleave(ctx, sm, base.roundTrip, cmds.roundTrip, floorRT.roundTrip)
	if err != nil {
		return nil, err
	}
	baseLat, cmdLat, floor := lats[0], lats[1], lats[2]
	// Stops in a pass of their own, with their own floor: a stop's fsync
	// slows whatever runs next on this machine, prepares included.
	var stopLats [][]time.Duration
	if o.stops {
		if stopLats, err = interleave(ctx, sm, base.roundTrip, cmds.stops, floorRT.roundTrip); err != nil {
			return nil, err
		}
	}
	deliver := cmds.deliver[o.warmup:]
	// The floor under the agent's journal: append one line and fsync, in
	// the filesystem the agent's data dir is on.
	fsyncLat, err := fsyncFloor(filepath.Join(e.dir, "fsync-probe"), o.warmup, o.samples)
	if err != nil {
		return nil, err
	}
	var runs *runTimings
	if o.runs > 0 {
		runs, err = submitToRunning(ctx, client, "localhost/bench@"+digest, o.runs, 30*time.Second)
		if err != nil {
			return nil, err
		}
	}
	prof.stop()

	rep := newReport("rtt")
	bs, cs := summarise(baseLat), summarise(cmdLat)
	rep.add("command round trip p50", cs.P50, "ms", bs.P50, "core request/reply p50")
	row := rep.add("command round trip p99", cs.P99, "ms", bs.P99, "core request/reply p99")
	row.goal("p99 ≤ 3× baseline", cs.P99 <= 3*bs.P99)
	fl := summarise(floor)
	rep.add("command floor p50: two JetStream hops, no logic", fl.P50, "ms", bs.P50, "core request/reply p50")
	rep.add("command floor p99: two JetStream hops, no logic", fl.P99, "ms", bs.P99, "core request/reply p99")
	rep.add("command round trip p99 vs its floor", cs.P99, "ms", fl.P99, "command floor p99").goal("p99 ≤ 1.3× its floor", cs.P99 <= 1.3*fl.P99)
	rep.Details["command_floor"] = fl
	if o.stops {
		ss, sf := summarise(stopLats[1]), summarise(stopLats[2])
		rep.add("stop command p50 (entry synced before its ack)", ss.P50, "ms", sf.P50, "command floor p50, same pass")
		rep.add("stop command p99 (entry synced before its ack)", ss.P99, "ms", sf.P99, "command floor p99, same pass")
		rep.Details["stop_round_trip"] = ss
		rep.Details["stop_pass_floor"] = sf
		rep.note("stop command = StopWorkload of an attempt never launched: journal append synced before the ack, and a workload report published before the receipt; timed in a second pass with request/reply and the floor")
	}
	ds, fs := summarise(deliver), summarise(fsyncLat)
	rep.add("  of which publish → agent starts handling, p50", ds.P50, "ms", 0, "")
	rep.add("journal floor: append + fsync p50", fs.P50, "ms", 0, "")
	rep.add("journal floor: append + fsync p99", fs.P99, "ms", 0, "")
	rep.add("command round trip p99 vs request/reply + fsync p99", cs.P99, "ms", bs.P99+fs.P99, "request/reply p99 + fsync p99")
	rep.Details["fsync_floor"] = fs
	rep.Details["baseline_request_reply"] = bs
	rep.Details["command_round_trip"] = cs
	rep.Details["publish_to_agent_accepted"] = ds
	rep.Details["payload_bytes"] = len(cmdBytes)
	if runs != nil {
		sr, pr := summarise(runs.submitToRunning), summarise(runs.placedToRunning)
		rep.add("Run submit → running p50 (noop runtime)", sr.P50, "ms", bs.P50, "core request/reply p50")
		rep.add("Run submit → running p99 (noop runtime)", sr.P99, "ms", bs.P99, "core request/reply p99")
		rep.add("Run placed → running p50 (event clock)", pr.P50, "ms", 0, "")
		rep.Details["run_submit_to_running"] = sr
		rep.Details["run_stages"] = runs.stages()
		rep.note("Run stages p50: %s", stageTable(runs.stages()))
	}
	rep.note("command floor = publish-with-ack into a stream configured as WF_CMDS, the node consumer's config and Consume, receipt publish-with-ack into one configured as WF_OBS, ack; no decode, fencing, journal or runtime")
	rep.note("command = PrepareImage with no Run, image already held: journal append, acked without waiting for the fsync (a prepare is idempotent)")
	rep.note("one in flight, %d samples after %d warm-up, same embedded NATS; payload %d bytes", o.samples, o.warmup, len(cmdBytes))
	rep.note("request/reply, command and floor timed in turn within each sample; each command and floor trip then waits, untimed, for its ack")
	if o.pace > 0 {
		rep.note("each request, command and floor round trip paced: %s pause before each", o.pace)
	}
	rep.Details["pace_ms"] = float64(o.pace) / float64(time.Millisecond)
	return rep, nil
}

// startNoopAgent runs a real agent over the no-op runtime and waits until
// the control plane's registry holds its session.
func startNoopAgent(e *env, nodeID string, ro noopruntime.Options) (*agent.Agent, func(), error) {
	return startAgent(e, agent.Config{NodeID: nodeID, Generation: 1, DataDir: filepath.Join(e.dir, "agent-"+nodeID),
		Capacity: schemas.Resources{CPUMillis: 64_000, MemoryBytes: 256 << 30}}, noopruntime.New(ro), nil)
}

// startAgent runs a real agent with cfg on rt (closeRT, when given, closes
// rt after the agent stops) and waits until the control plane's registry
// holds its session.
func startAgent(e *env, cfg agent.Config, rt noderuntime.Runtime, closeRT func()) (*agent.Agent, func(), error) {
	nodeID := cfg.NodeID
	conn, err := e.connect("agent-" + nodeID)
	if err != nil {
		return nil, nil, err
	}
	a, err := agent.New(cfg, conn, rt, e.log.Named(nodeID))
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stop := func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
		}
		if closeRT != nil {
			closeRT()
		}
	}
	kv, err := conn.JS.KeyValue(ctx, bus.BucketNodes)
	if err != nil {
		stop()
		return nil, nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var rec schemas.NodeRecord
		if _, err := bus.GetJSON(ctx, kv, nodeID, &rec); err == nil && rec.FencingToken != 0 && rec.FencingToken == a.Enrollment().FencingToken {
			return a, stop, nil
		}
		select {
		case err := <-done:
			stop()
			return nil, nil, fmt.Errorf("agent stopped: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, nil, errors.New("agent did not enroll in 30s")
		}
	}
}

func rttCommand(nodeID string, enr schemas.Enrollment, op, digest string) schemas.Command {
	return schemas.Command{
		OperationID: op, NodeID: nodeID, FencingToken: enr.FencingToken, Generation: enr.Generation,
		Kind: schemas.CmdPrepareImage, IssuedAt: time.Now(),
		PrepareImage: &schemas.PrepareImage{Reference: "localhost/bench@" + digest, ManifestDigest: digest, Unpack: true},
	}
}

// probe is a round trip ready to be timed, and what it holds open.
type probe struct {
	roundTrip
	close func()
}

// requestReply is core request/reply with a responder on its own
// connection, one request in flight.
func requestReply(e *env, client *bus.Conn, size int) (*probe, error) {
	resp, err := e.connect("bench-responder")
	if err != nil {
		return nil, err
	}
	sub, err := resp.NC.Subscribe("bench.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		return nil, err
	}
	if err := resp.NC.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	payload := make([]byte, size)
	return &probe{
		roundTrip: roundTrip{name: "request/reply", once: func(ctx context.Context, _ int) (time.Duration, error) {
			t0 := time.Now()
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if _, err := client.NC.RequestWithContext(rctx, "bench.echo", payload); err != nil {
				return 0, err
			}
			return time.Since(t0), nil
		}},
		close: func() { _ = sub.Unsubscribe() },
	}, nil
}

// rttStop is a stop for an attempt this node never launched: its journal
// entry is synced before the ack (syncBeforeAck), and the agent reports the
// attempt failed before the receipt, one more publish-with-ack than a
// prepare makes.
func rttStop(nodeID string, enr schemas.Enrollment, op string) schemas.Command {
	return schemas.Command{
		OperationID: op, NodeID: nodeID, FencingToken: enr.FencingToken, Generation: enr.Generation,
		Kind: schemas.CmdStopWorkload, IssuedAt: time.Now(),
		Stop: &schemas.StopWorkload{AttemptID: op + "-a1", Reason: "bench"},
	}
}

// commandProbe publishes commands as dispatch does and times each receipt:
// roundTrip sends prepares, stops sends stops (rttStop).
type commandProbe struct {
	probe
	stops roundTrip
	// deliver is publish → the agent's AcceptedAt (same machine clock), one
	// per prepare round trip, warm-up included.
	deliver []time.Duration
}

func commandRTT(client *bus.Conn, nodeID string, enr schemas.Enrollment, digest string) (*commandProbe, error) {
	type receipt struct {
		seen       time.Time
		acceptedAt time.Time
	}
	var (
		mu      sync.Mutex
		waiting = map[string]chan receipt{}
	)
	sub, err := client.NC.Subscribe(bus.NodeObs(nodeID), func(m *nats.Msg) {
		now := time.Now()
		var o schemas.Observation
		if codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &o) != nil || o.Receipt == nil {
			return
		}
		mu.Lock()
		ch := waiting[o.Receipt.OperationID]
		delete(waiting, o.Receipt.OperationID)
		mu.Unlock()
		if ch != nil {
			ch <- receipt{now, o.Receipt.AcceptedAt}
		}
	})
	if err != nil {
		return nil, err
	}
	acked, stopAcks, err := watchAcks(client, bus.StreamCmds, bus.NodeConsumer(nodeID))
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	p := &commandProbe{}
	p.close = func() { _ = sub.Unsubscribe(); stopAcks() }
	trip := func(ctx context.Context, op string, c schemas.Command, deliver *[]time.Duration) (time.Duration, error) {
		b, err := codec.Encode(codec.MsgPack, c)
		if err != nil {
			return 0, err
		}
		ch := make(chan receipt, 1)
		mu.Lock()
		waiting[op] = ch
		mu.Unlock()
		t0 := time.Now()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = client.JS.PublishMsg(pctx, &nats.Msg{Subject: bus.NodeCmd(nodeID), Data: b},
			jetstream.WithMsgID(op+":"+strconv.FormatUint(c.FencingToken, 10)))
		cancel()
		if err != nil {
			return 0, fmt.Errorf("publish command: %w", err)
		}
		select {
		case r := <-ch:
			if deliver != nil {
				*deliver = append(*deliver, r.acceptedAt.Sub(t0))
			}
			// Untimed: the agent's ack (after the journal sync, for a
			// stop) ends the command's work, so the next probe starts on a
			// settled machine.
			return r.seen.Sub(t0), waitAck(ctx, acked, op)
		case <-time.After(10 * time.Second):
			return 0, fmt.Errorf("no receipt for %s in 10s (%s)", op, consumerState(ctx, client, bus.StreamCmds, bus.NodeConsumer(nodeID)))
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	p.roundTrip = roundTrip{name: "command", once: func(ctx context.Context, i int) (time.Duration, error) {
		op := fmt.Sprintf("bench-rtt-%s-%06d", nonce, i)
		return trip(ctx, op, rttCommand(nodeID, enr, op, digest), &p.deliver)
	}}
	p.stops = roundTrip{name: "stop command", once: func(ctx context.Context, i int) (time.Duration, error) {
		op := fmt.Sprintf("bench-rtt-stop-%s-%06d", nonce, i)
		return trip(ctx, op, rttStop(nodeID, enr, op), nil)
	}}
	return p, nil
}

// runTimings are whole Runs timed from their events.
type runTimings struct {
	submitToRunning []time.Duration // wall clock: publish → running event seen
	placedToRunning []time.Duration // event At: placed → running
	byStage         map[string][]time.Duration
}

var stageOrder = []string{"submit→accepted", "accepted→placed", "placed→preparing", "preparing→launching", "launching→running", "submit→running"}

func (r *runTimings) stages() map[string]Latencies {
	out := map[string]Latencies{}
	for k, v := range r.byStage {
		out[k] = summarise(v)
	}
	return out
}

// runWatch follows every Run's events on a core subscription.
type runWatch struct {
	mu     sync.Mutex
	phases map[string]map[schemas.Phase]time.Time // run → phase → event At
	seen   map[string]map[schemas.Phase]time.Time // run → phase → when this process saw it
	accAt  map[string]time.Time
	cond   chan struct{}
	sub    *nats.Subscription
}

func watchRuns(nc *nats.Conn) (*runWatch, error) {
	w := &runWatch{phases: map[string]map[schemas.Phase]time.Time{}, seen: map[string]map[schemas.Phase]time.Time{},
		accAt: map[string]time.Time{}, cond: make(chan struct{}, 1)}
	sub, err := nc.Subscribe(bus.SubjectEventsAll, func(m *nats.Msg) {
		now := time.Now()
		var ev schemas.RunEvent
		if json.Unmarshal(m.Data, &ev) != nil {
			return
		}
		w.mu.Lock()
		switch ev.Type {
		case schemas.EventAccepted:
			if _, ok := w.accAt[ev.RunID]; !ok {
				w.accAt[ev.RunID] = ev.At
			}
		case schemas.EventPhase:
			if w.phases[ev.RunID] == nil {
				w.phases[ev.RunID], w.seen[ev.RunID] = map[schemas.Phase]time.Time{}, map[schemas.Phase]time.Time{}
			}
			if _, ok := w.phases[ev.RunID][ev.Phase]; !ok {
				w.phases[ev.RunID][ev.Phase], w.seen[ev.RunID][ev.Phase] = ev.At, now
			}
		}
		w.mu.Unlock()
		select {
		case w.cond <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	_ = sub.SetPendingLimits(-1, -1)
	w.sub = sub
	return w, nc.Flush()
}

// waitTerminal waits until the Run reaches a terminal phase, and returns
// its phase times (event At) and when each was seen here.
func (w *runWatch) waitTerminal(ctx context.Context, runID string, within time.Duration) (map[schemas.Phase]time.Time, map[schemas.Phase]time.Time, time.Time, error) {
	deadline := time.After(within)
	for {
		w.mu.Lock()
		ph, seen, acc := w.phases[runID], w.seen[runID], w.accAt[runID]
		done := false
		for p := range ph {
			if p.Terminal() {
				done = true
			}
		}
		if done {
			w.mu.Unlock()
			return ph, seen, acc, nil
		}
		w.mu.Unlock()
		select {
		case <-w.cond:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			return nil, nil, time.Time{}, fmt.Errorf("run %s not terminal after %s (phases %v)", runID, within, keys(ph))
		case <-ctx.Done():
			return nil, nil, time.Time{}, ctx.Err()
		}
	}
}

func keys(m map[schemas.Phase]time.Time) []string {
	var out []string
	for k := range m {
		out = append(out, string(k))
	}
	return out
}

// submitToRunning submits n Runs one after another, each once the last
// ended, and times their phases.
func submitToRunning(ctx context.Context, client *bus.Conn, image string, n int, within time.Duration) (*runTimings, error) {
	w, err := watchRuns(client.NC)
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.sub.Unsubscribe() }()
	out := &runTimings{byStage: map[string][]time.Duration{}}
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i := range n {
		rid := fmt.Sprintf("bench-run-%s-%04d", nonce, i)
		m, err := submitMsg(runRequest(rid, image), codec.JSON)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		if _, err := client.JS.PublishMsg(ctx, m, jetstream.WithMsgID(rid)); err != nil {
			return nil, err
		}
		runID := schemas.RunIDFor(rid)
		ph, seen, acc, err := w.waitTerminal(ctx, runID, within)
		if err != nil {
			return nil, err
		}
		out.add(t0, acc, ph, seen)
	}
	return out, nil
}

func (r *runTimings) add(submitted, accepted time.Time, ph, seen map[schemas.Phase]time.Time) {
	running, ok := ph[schemas.PhaseRunning]
	if !ok {
		return // went straight to a terminal phase; not a sample
	}
	r.submitToRunning = append(r.submitToRunning, seen[schemas.PhaseRunning].Sub(submitted))
	r.byStage["submit→running"] = append(r.byStage["submit→running"], seen[schemas.PhaseRunning].Sub(submitted))
	if p, ok := ph[schemas.PhasePlaced]; ok {
		r.placedToRunning = append(r.placedToRunning, running.Sub(p))
	}
	if !accepted.IsZero() {
		r.byStage["submit→accepted"] = append(r.byStage["submit→accepted"], accepted.Sub(submitted))
	}
	// Stages between consecutive phases the Run passed through; a skipped
	// phase folds into the next stage.
	prevName, prev := "accepted", accepted
	for _, p := range []schemas.Phase{schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning} {
		at, ok := ph[p]
		if !ok {
			continue
		}
		if !prev.IsZero() {
			k := prevName + "→" + string(p)
			r.byStage[k] = append(r.byStage[k], at.Sub(prev))
		}
		prevName, prev = string(p), at
	}
}

// stageTable renders stages in lifecycle order for a note.
func stageTable(st map[string]Latencies) string {
	var parts []string
	for _, k := range stageOrder {
		if l, ok := st[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f ms", k, l.P50))
		}
	}
	return strings.Join(parts, ", ")
}

// fsyncFloor times what the agent's journal does per command, in the same
// filesystem: append one line and fsync.
func fsyncFloor(path string, warmup, samples int) ([]time.Duration, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close(); _ = os.Remove(path) }()
	line := []byte(`{"operation_id":"bench-rtt-0000000000000-000000","kind":"prepare_image","outcome":"applied","applied_at":"2026-01-01T00:00:00Z"}` + "\n")
	out := make([]time.Duration, 0, samples)
	for i := range warmup + samples {
		t0 := time.Now()
		if _, err := f.Write(line); err != nil {
			return nil, err
		}
		if err := f.Sync(); err != nil {
			return nil, err
		}
		if i >= warmup {
			out = append(out, time.Since(t0))
		}
	}
	return out, nil
}

// watchAcks copies the acks sent for a consumer's messages: they are core
// publishes to $JS.ACK.<stream>.<consumer>.…, which any subscriber also
// receives. One command is in flight, so the next "+ACK" is its.
func watchAcks(c *bus.Conn, stream, consumer string) (<-chan struct{}, func(), error) {
	acked := make(chan struct{}, 1)
	sub, err := c.NC.Subscribe("$JS.ACK."+stream+"."+consumer+".>", func(m *nats.Msg) {
		if len(m.Data) == 0 || string(m.Data) == "+ACK" {
			select {
			case acked <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		return nil, nil, err
	}
	if err := c.NC.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, nil, err
	}
	return acked, func() { _ = sub.Unsubscribe() }, nil
}

func waitAck(ctx context.Context, acked <-chan struct{}, op string) error {
	select {
	case <-acked:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s: receipt seen but no ack in 10s", op)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// consumerState describes a consumer for an error: where a command stuck.
func consumerState(ctx context.Context, c *bus.Conn, stream, name string) string {
	cons, err := c.JS.Consumer(ctx, stream, name)
	if err != nil {
		return "consumer info: " + err.Error()
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return "consumer info: " + err.Error()
	}
	return fmt.Sprintf("consumer %s: pending %d, ack pending %d, redelivered %d, waiting pulls %d, delivered seq %d, ack floor %d",
		name, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, ci.Delivered.Stream, ci.AckFloor.Stream)
}
