package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/schemas"
)

type rttOpts struct {
	samples int
	warmup  int
	runs    int
	pace    time.Duration
	stops   bool
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
		RunE: g.reporting(func(ctx context.Context) (*Report, error) { return runRTT(ctx, g, o) }),
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
	e, err := startEnv(g, "rtt", controlplane.Config{HeartbeatInterval: time.Second, OpenEnrollment: true})
	if err != nil {
		return nil, err
	}
	defer e.close()
	res, err := measureRTT(ctx, e, o, prof)
	if err != nil {
		return nil, err
	}
	return res.report(o), nil
}

// rttResult is what rtt timed.
type rttResult struct {
	// base, cmd and floor are the first pass's round trips; stops, with
	// --stops, the second pass's (request/reply, stop, floor).
	base, cmd, floor []time.Duration
	stops            [][]time.Duration
	// deliver is publish → the agent starts handling, per timed command.
	deliver []time.Duration
	fsync   []time.Duration
	runs    *runTimings
	payload int
}

// measureRTT times the command round trips (and with --stops the stops)
// in turn with request/reply and the floor, then the journal's fsync floor
// and whole Runs, on one agent over the no-op runtime.
func measureRTT(ctx context.Context, e *env, o rttOpts, prof *profiler) (*rttResult, error) {
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
	probes, err := newRTTProbes(ctx, e, client, nodeID, ag.Enrollment(), digest, prof)
	if err != nil {
		return nil, err
	}
	defer probes.close()
	res := &rttResult{payload: probes.payload}
	sm := sampling{warmup: o.warmup, samples: o.samples, pace: o.pace}
	lats, err := interleave(ctx, sm, probes.base.roundTrip, probes.cmds.roundTrip, probes.floor.roundTrip)
	if err != nil {
		return nil, err
	}
	res.base, res.cmd, res.floor = lats[0], lats[1], lats[2]
	// Stops in a pass of their own, with their own floor: a stop's fsync
	// slows whatever runs next on this machine, prepares included.
	if o.stops {
		if res.stops, err = interleave(ctx, sm, probes.base.roundTrip, probes.cmds.stops, probes.floor.roundTrip); err != nil {
			return nil, err
		}
	}
	res.deliver = probes.cmds.deliver[o.warmup:]
	// The floor under the agent's journal: append one line and fsync, in
	// the filesystem the agent's data dir is on.
	if res.fsync, err = fsyncFloor(filepath.Join(e.dir, "fsync-probe"), o.warmup, o.samples); err != nil {
		return nil, err
	}
	if o.runs > 0 {
		if res.runs, err = submitToRunning(ctx, client, "localhost/bench@"+digest, o.runs, 30*time.Second); err != nil {
			return nil, err
		}
	}
	prof.stop()
	return res, nil
}

// rttProbes are the round trips rtt times in turn: core request/reply of
// the command's size (the baseline), the command, and the same trip
// through JetStream with no logic (the floor).
type rttProbes struct {
	base, floor *probe
	cmds        *commandProbe
	payload     int
	cleanup     undo // each probe's close, once it is set up
}

// newRTTProbes sets the probes up and starts the profile.
func newRTTProbes(ctx context.Context, e *env, client *bus.Conn, nodeID string, enr schemas.Enrollment, digest string, prof *profiler) (*rttProbes, error) {
	cmdBytes, err := codec.Encode(codec.MsgPack, rttCommand(nodeID, enr, "bench-rtt-sample-000000", digest))
	if err != nil {
		return nil, err
	}
	p := &rttProbes{payload: len(cmdBytes)}
	if err := prof.start(); err != nil {
		return nil, err
	}
	if p.base, err = requestReply(e, client, len(cmdBytes)); err != nil {
		return nil, fmt.Errorf("baseline: %w", err)
	}
	p.cleanup.push(p.base.close)
	if p.cmds, err = commandRTT(client, nodeID, enr, digest); err != nil {
		p.close()
		return nil, err
	}
	p.cleanup.push(p.cmds.close)
	if p.floor, err = commandFloor(ctx, e, client, len(cmdBytes)); err != nil {
		p.close()
		return nil, err
	}
	p.cleanup.push(p.floor.close)
	return p, nil
}

func (p *rttProbes) close() { p.cleanup.run() }

func (r *rttResult) report(o rttOpts) *Report {
	rep := newReport("rtt")
	bs, cs := summarise(r.base), summarise(r.cmd)
	rep.add("command round trip p50", cs.P50, "ms", bs.P50, "core request/reply p50")
	row := rep.add("command round trip p99", cs.P99, "ms", bs.P99, "core request/reply p99")
	row.goal("p99 ≤ 3× baseline", cs.P99 <= 3*bs.P99)
	fl := summarise(r.floor)
	rep.add("command floor p50: two JetStream hops, no logic", fl.P50, "ms", bs.P50, "core request/reply p50")
	rep.add("command floor p99: two JetStream hops, no logic", fl.P99, "ms", bs.P99, "core request/reply p99")
	rep.add("command round trip p99 vs its floor", cs.P99, "ms", fl.P99, "command floor p99").goal("p99 ≤ 1.3× its floor", cs.P99 <= 1.3*fl.P99)
	rep.Details["command_floor"] = fl
	if o.stops {
		ss, sf := summarise(r.stops[1]), summarise(r.stops[2])
		rep.add("stop command p50 (entry synced before its ack)", ss.P50, "ms", sf.P50, "command floor p50, same pass")
		rep.add("stop command p99 (entry synced before its ack)", ss.P99, "ms", sf.P99, "command floor p99, same pass")
		rep.Details["stop_round_trip"] = ss
		rep.Details["stop_pass_floor"] = sf
		rep.note("stop command = StopWorkload of an attempt never launched: journal append synced before the ack, and a workload report published before the receipt; timed in a second pass with request/reply and the floor")
	}
	ds, fs := summarise(r.deliver), summarise(r.fsync)
	rep.add("  of which publish → agent starts handling, p50", ds.P50, "ms", 0, "")
	rep.add("journal floor: append + fsync p50", fs.P50, "ms", 0, "")
	rep.add("journal floor: append + fsync p99", fs.P99, "ms", 0, "")
	rep.add("command round trip p99 vs request/reply + fsync p99", cs.P99, "ms", bs.P99+fs.P99, "request/reply p99 + fsync p99")
	rep.Details["fsync_floor"] = fs
	rep.Details["baseline_request_reply"] = bs
	rep.Details["command_round_trip"] = cs
	rep.Details["publish_to_agent_accepted"] = ds
	rep.Details["payload_bytes"] = r.payload
	if r.runs != nil {
		r.reportRuns(rep, bs)
	}
	rep.note("command floor = publish-with-ack into a stream configured as WF_CMDS, the node consumer's config and Consume, receipt publish-with-ack into one configured as WF_OBS, ack; no decode, fencing, journal or runtime")
	rep.note("command = PrepareImage with no Run, image already held: journal append, acked without waiting for the fsync (a prepare is idempotent)")
	rep.note("one in flight, %d samples after %d warm-up, same embedded NATS; payload %d bytes", o.samples, o.warmup, r.payload)
	rep.note("request/reply, command and floor timed in turn within each sample; each command and floor trip then waits, untimed, for its ack")
	if o.pace > 0 {
		rep.note("each request, command and floor round trip paced: %s pause before each", o.pace)
	}
	rep.Details["pace_ms"] = float64(o.pace) / float64(time.Millisecond)
	return rep
}

// reportRuns adds whole Runs' submit → running against request/reply.
func (r *rttResult) reportRuns(rep *Report, bs Latencies) {
	sr, pr := summarise(r.runs.submitToRunning), summarise(r.runs.placedToRunning)
	rep.add("Run submit → running p50 (noop runtime)", sr.P50, "ms", bs.P50, "core request/reply p50")
	rep.add("Run submit → running p99 (noop runtime)", sr.P99, "ms", bs.P99, "core request/reply p99")
	rep.add("Run placed → running p50 (event clock)", pr.P50, "ms", 0, "")
	rep.Details["run_submit_to_running"] = sr
	rep.Details["run_stages"] = r.runs.stages()
	rep.note("Run stages p50: %s", stageTable(r.runs.stages()))
}
