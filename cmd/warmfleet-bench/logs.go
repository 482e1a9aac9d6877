package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

type logsOpts struct {
	mib        int
	attempts   int
	rounds     int
	meanLine   int
	batch      bool
	samples    int
	warmup     int
	pace       time.Duration
	flood      string
	floodFor   time.Duration
	floodMiB   int
	floodCPU   int64
	settle     time.Duration
	profile    string
	shipLimit  time.Duration
	logPoll    time.Duration
	control    bool
	writerMiBs int
}

// benchLogWindow is the agent's window of chunks in flight per attempt
// (agent/output's window); the raw baseline publishes with the same.
const benchLogWindow = 16

// logsHelp is the logs command's long help.
const logsHelp = `logs measures how a node ships its workloads' output to WF_LOGS, and what a
flooding workload does to the node's command path.

Shipping throughput (--rounds rounds). Each round the bench writes --mib MiB
of numbered, log-like lines (about --line-bytes each, every 16th on stderr)
into --attempts output directories with nodelog.Write, the log writer's own
code, from in-memory readers: each directory is made by
agent.PrepareOutput under a fresh agent data dir and marked done. Then, in
an order that alternates from round to round:

  raw    the same chunks (read back with nodelog.NewTail(...).Next before
         the phase, so their boundaries are the agent's, and held in
         memory) published with PublishMsgAsync into WF_LOGS on one
         connection: one goroutine per attempt, at most 16 chunks in
         flight each (a sliding window), the agent's subject, headers and
         Nats-Msg-Id form (other attempt ids), then each stream's empty
         end message with publish-with-ack, as the agent sends it.
  agent  a real agent (agent.Agent over internal/noopruntime, a fresh node
         enrolled with the in-process control plane) starts on the data
         dir; at reconcile it ships every directory its runtime does not
         hold (from the files, journaling intents and acks) and removes
         each one once stored.
  batch  (--batch-baseline) the raw publisher again, but filling 16 and
         then waiting for all 16 acks before sending more: the agent's
         own pattern (agent/output's send/ack pump).

Throughput is bytes (and lines) over the time from the server's store
stamp of the phase's first message to that of its last (the last end
message), read back from WF_LOGS after the phase; nothing watches the
stream during it. The agent's start (connect, enroll, reconcile) is
outside that window and reported apart, as is start → every directory
removed. WF_LOGS is purged between phases. The goal row is the median of
the per-round ratios agent ÷ raw.

CPU per MiB: the whole bench process's user+system CPU (getrusage
RUSAGE_SELF) over each phase, divided by the MiB shipped. The process holds
the NATS server and the control plane, so the raw phase's figure is what
the server, the client library and a bare publisher cost for these bytes;
the agent phase's is that plus the agent (reading the files and their
times index, the shipping journal, its enrollment and reconcile, which run
inside the phase). Their difference is reported as the agent's CPU per
MiB. The raw phase's chunks are read from disk before it, untimed.

Command round trip during a flood (--flood). A real agent, and a
PrepareImage command timed from publish to the agent's receipt exactly as
rtt does (one in flight, each then waits untimed for its ack), interleaved
with core request/reply on the same server, --pace before each. The
command's image is answered at once by a thin wrapper over the runtime, so
the runtime's own EnsureImage is not on the path. Idle: --samples of each,
half before the flood and half after it, pooled, with no workload running.
Flood: the same, from --settle after one Run is running until it has ended
(at most 4× --samples), while the Run floods its stdout with 100-byte lines
for --flood-for (busybox yes in 16 MiB batches, as fast as it can); a Run's
exit report waits for its output to be stored, so the window covers the
writing and the shipping. Two cases, each with a fresh NATS, control plane
and agent: the agent's default limit (LogRate 1 MiB/s, burst 8 MiB: the
writer drops the rest and a marker line says how much), and the limit off
(LogRate -1; the flood then stops after --flood-mib MiB, so that it ends).
With --control, the first case also times the same workload with its output
sent to /dev/null inside the container: the CPU the flood burns, without a
byte for the log writer or the agent. Busy cores are from /proc/stat (every
process on the machine, other tenants included) and getrusage (this
process: NATS, control plane, agent).

  containerd  a private containerd (as e2e; needs root), the agent on the
              containerd adapter: the shim runs this binary as the log
              writer, a separate process; the flood is a busybox container
              with --flood-cpu millicores.
  writer      without containerd: the agent on the no-op runtime, and the
              bench itself writes the Run's output directory with
              nodelog.Write from an in-memory reader of the same lines at
              --writer-mibps, with the agent's limit: the writer then runs
              in the bench process.
  auto        containerd when it can start, else writer; none skips.`

func newLogsCmd(g *globals) *cobra.Command {
	o := logsOpts{}
	cmd := &cobra.Command{
		Use:   "logs",
		Short: "Output shipping throughput and CPU vs raw JetStream publish; command round trip during a log flood",
		Long:  logsHelp,
		RunE:  g.reporting(func(ctx context.Context) (*Report, error) { return runLogs(ctx, g, o) }),
	}
	f := cmd.Flags()
	f.IntVar(&o.mib, "mib", 256, "MiB of output shipped per phase and round, across --attempts")
	f.IntVar(&o.attempts, "attempts", 4, "output directories (Run attempts) per round, shipped at once")
	f.IntVar(&o.rounds, "rounds", 3, "throughput rounds (raw and agent phases alternate which goes first); the median is reported")
	f.IntVar(&o.meanLine, "line-bytes", 120, "mean line length of the generated output (lines vary from about half to one and a half of it)")
	f.BoolVar(&o.batch, "batch-baseline", true, "also time the raw publisher sending 16 and waiting for all 16 acks, as the agent does")
	f.IntVar(&o.samples, "samples", 1000, "idle command round trips (and requests) timed per case; during the flood, up to 4× as many, until the Run ends")
	f.IntVar(&o.warmup, "warmup", 50, "untimed command round trips before the idle ones")
	f.DurationVar(&o.pace, "pace", 2*time.Millisecond, "pause before each timed command and request, so samples spread over the flood")
	f.StringVar(&o.flood, "flood", "auto", "how the flood is made: containerd, writer, auto or none")
	f.DurationVar(&o.floodFor, "flood-for", 6*time.Second, "how long the flooding Run writes")
	f.IntVar(&o.floodMiB, "flood-mib", 64, "with the limit off, the flood stops after this many MiB")
	f.Int64Var(&o.floodCPU, "flood-cpu", 1000, "the flooding container's CPU, millicores (containerd)")
	f.IntVar(&o.writerMiBs, "writer-mibps", 150, "--flood writer: how fast the in-memory flood is read, MiB/s (busybox yes into a pipe writes about 150 MB/s here)")
	f.BoolVar(&o.control, "control", true, "containerd: also time round trips while the same workload runs with its output sent to /dev/null in the container (its CPU without its log)")
	f.DurationVar(&o.settle, "settle", 500*time.Millisecond, "wait after the flooding Run is running before timing")
	f.StringVar(&o.profile, "profile-phase", "agent", "the phase --cpuprofile covers: agent or raw (the last round's), or flood or flood-nolimit")
	f.DurationVar(&o.shipLimit, "ship-timeout", 120*time.Second, "give up on a phase that has not shipped everything in this long")
	f.DurationVar(&o.logPoll, "log-poll", 0, "diagnosis only: the throughput agent's LogPoll (0: the agent's default, 100ms)")
	return cmd
}

func runLogs(ctx context.Context, g *globals, o logsOpts) (*Report, error) {
	if o.attempts < 1 || o.mib < 1 || o.rounds < 1 {
		return nil, errors.New("--attempts, --mib and --rounds must be at least 1")
	}
	switch o.profile {
	case "agent", "raw", "flood", "flood-nolimit":
	default:
		return nil, fmt.Errorf("--profile-phase %q: use agent, raw, flood or flood-nolimit", o.profile)
	}
	mode, why, err := floodMode(o.flood)
	if err != nil {
		return nil, err
	}
	prof, err := newProfiler(g.cpuProfile)
	if err != nil {
		return nil, err
	}
	defer prof.close()
	rep := newReport("logs")
	ship, err := shipThroughput(ctx, g, o, prof)
	if err != nil {
		return nil, err
	}
	ship.report(rep, o)
	if mode != "none" {
		fl, err := floodRoundTrips(ctx, g, o, mode, prof)
		if err != nil {
			return nil, fmt.Errorf("flood (%s): %w", mode, err)
		}
		fl.report(rep, o, mode)
	}
	if why != "" {
		rep.note("%s", why)
	}
	return rep, nil
}
