package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/schemas"
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

func newLogsCmd(g *globals) *cobra.Command {
	o := logsOpts{}
	cmd := &cobra.Command{
		Use:   "logs",
		Short: "Output shipping throughput and CPU vs raw JetStream publish; command round trip during a log flood",
		Long: `logs measures how a node ships its workloads' output to WF_LOGS, and what a
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
         own pattern (agent/output's send/ack loop).

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
  auto        containerd when it can start, else writer; none skips.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := runLogs(cmd.Context(), g, o)
			if err != nil {
				return err
			}
			return rep.print(cmd.OutOrStdout(), g.output)
		},
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

// shipRound is one throughput round.
type shipRound struct {
	Round  int      `json:"round"`
	Order  []string `json:"order"`
	Bytes  int64    `json:"bytes"`
	Lines  int64    `json:"lines"`
	Chunks int      `json:"chunks"`
	Raw    phaseFig `json:"raw"`
	Agent  phaseFig `json:"agent"`
	Batch  phaseFig `json:"batch,omitzero"`
	Ratio  float64  `json:"agent_over_raw"`
	// Agent only: start → enrolled (startAgent returned), start → first
	// chunk stored, start → every output directory removed.
	AgentEnrolledS   float64 `json:"agent_start_to_enrolled_s"`
	AgentFirstChunkS float64 `json:"agent_start_to_first_stored_s"`
	AgentAllGoneS    float64 `json:"agent_start_to_dirs_removed_s"`
	// ShippedBytes is what the agent's LogMetrics counted as stored.
	ShippedBytes int64 `json:"agent_metrics_shipped_bytes"`
}

// phaseFig is one phase of a round: its window by the server's store
// stamps, the rates over it, and the process CPU over the whole phase.
type phaseFig struct {
	WindowS    float64 `json:"window_s"`
	MiBPerS    float64 `json:"mib_per_s"`
	LinesPerS  float64 `json:"lines_per_s"`
	CPUSeconds float64 `json:"process_cpu_s"`
	WallS      float64 `json:"phase_wall_s"`
	CPUmsPerMB float64 `json:"process_cpu_ms_per_mib"`
	Stored     uint64  `json:"messages_stored"`
}

type shipResult struct {
	rounds []shipRound
	idle   float64 // process cores with the control plane and no agent
}

// attemptContent is one attempt's output, generated once and written into
// a fresh directory each round.
type attemptContent struct {
	out, err []byte
	lines    int64
}

// genContent makes size bytes of numbered log lines of about meanLine
// bytes each (half to one and a half of it); every 16th goes to stderr.
func genContent(seed uint64, size int64, meanLine int) attemptContent {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	const filler = "the quick brown fox jumps over the lazy dog while the data loader prefetches the next shard of tokens "
	c := attemptContent{out: make([]byte, 0, size+size/8), err: make([]byte, 0, size/8)}
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for n := int64(0); int64(len(c.out)+len(c.err)) < size; n++ {
		at := t0.Add(time.Duration(n) * 1337 * time.Microsecond).Format("2006-01-02T15:04:05.000000Z")
		want := meanLine/2 + r.IntN(meanLine+1)
		if n%16 == 15 {
			line := fmt.Appendf(nil, "%s WARN  step=%09d grad_norm=%.4f clipped to 1.0 ", at, n, 1+r.Float64()*9)
			c.err = append(c.err, pad(line, want, filler)...)
		} else {
			line := fmt.Appendf(nil, "%s INFO  step=%09d loss=%.6f lr=3.0e-04 tok/s=%d ", at, n, r.Float64()*4, 40000+r.IntN(20000))
			c.out = append(c.out, pad(line, want, filler)...)
		}
		c.lines++
	}
	return c
}

// pad fills line to about want bytes (never cutting its fields) and ends it.
func pad(line []byte, want int, filler string) []byte {
	for len(line) < want-1 {
		line = append(line, filler[:min(len(filler), want-1-len(line))]...)
	}
	return append(line, '\n')
}

// rawAttempt is one attempt's chunks, read back from its directory.
type rawAttempt struct {
	chunks [2][]nodelog.Chunk
	size   [2]int64
}

func readChunks(dir string) (rawAttempt, error) {
	var ra rawAttempt
	for _, s := range nodelog.Streams {
		t := nodelog.NewTail(dir, s, 0)
		for {
			c, ok, err := t.Next(bus.MaxLogChunk, true, time.Now())
			if err != nil {
				_ = t.Close()
				return ra, err
			}
			if !ok {
				break
			}
			ra.chunks[s] = append(ra.chunks[s], c)
			ra.size[s] = c.End()
		}
		_ = t.Close()
	}
	return ra, nil
}

// publish sends the attempt's chunks as the agent does, as Run runID's
// first attempt (ids must differ from every earlier phase's, or dedupe
// drops them), with at most benchLogWindow in flight: a sliding window, or
// (batch) filled and then drained whole, as agent/output's loop does.
// Then each stream's end.
func (ra rawAttempt) publish(ctx context.Context, js jetstream.JetStream, runID, node string, batch bool) error {
	subject, attempt := bus.RunLogs(runID), schemas.WorkloadID(runID, 1)
	var queue []jetstream.PubAckFuture
	ackHead := func() error {
		select {
		case <-queue[0].Ok():
		case err := <-queue[0].Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
		queue = queue[1:]
		return nil
	}
	for _, s := range nodelog.Streams {
		for _, c := range ra.chunks[s] {
			if len(queue) >= benchLogWindow {
				// Sliding: the oldest ack frees one slot. Batch: all of them.
				for n := len(queue); len(queue) > 0 && (batch || len(queue) == n); {
					if err := ackHead(); err != nil {
						return err
					}
				}
			}
			m := nats.NewMsg(subject)
			m.Data = c.Data
			m.Header.Set(bus.HeaderLogAttempt, attempt)
			m.Header.Set(bus.HeaderLogStream, s.String())
			m.Header.Set(bus.HeaderLogOffset, strconv.FormatInt(c.Offset, 10))
			m.Header.Set(bus.HeaderLogNode, node)
			if !c.At.IsZero() {
				m.Header.Set(bus.HeaderLogTime, c.At.UTC().Format(time.RFC3339Nano))
			}
			f, err := js.PublishMsgAsync(m, jetstream.WithMsgID(bus.LogMsgID(attempt, s.String(), c.Offset)))
			if err != nil {
				return err
			}
			queue = append(queue, f)
		}
	}
	for len(queue) > 0 {
		if err := ackHead(); err != nil {
			return err
		}
	}
	for _, s := range nodelog.Streams {
		m := nats.NewMsg(subject)
		m.Header.Set(bus.HeaderLogAttempt, attempt)
		m.Header.Set(bus.HeaderLogStream, s.String())
		m.Header.Set(bus.HeaderLogNode, node)
		m.Header.Set(bus.HeaderLogEnd, strconv.FormatInt(ra.size[s], 10))
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := js.PublishMsg(pctx, m, jetstream.WithMsgID(bus.LogEndMsgID(attempt, s.String())))
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

func shipThroughput(ctx context.Context, g *globals, o logsOpts, prof *profiler) (*shipResult, error) {
	e, err := newEnv(g, "logs")
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := e.startCP(controlplane.Config{HeartbeatInterval: time.Second, OpenEnrollment: true}); err != nil {
		return nil, err
	}
	pub, err := e.connect("bench-raw-publisher")
	if err != nil {
		return nil, err
	}
	stream, err := pub.JS.Stream(ctx, bus.StreamLogs)
	if err != nil {
		return nil, err
	}
	per := int64(o.mib) << 20 / int64(o.attempts)
	contents := make([]attemptContent, o.attempts)
	var lines, total int64
	for i := range contents {
		contents[i] = genContent(uint64(i+1), per, o.meanLine)
		lines += contents[i].lines
		total += int64(len(contents[i].out) + len(contents[i].err))
	}
	res := &shipResult{}
	// What the process burns with the control plane up and nothing to do.
	idle, err := startMeter(os.Getpid())
	if err != nil {
		return nil, err
	}
	time.Sleep(time.Second)
	res.idle, _ = idle.cores()

	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	digest := benchDigest("logs")
	for r := range o.rounds {
		last := r == o.rounds-1
		round := shipRound{Round: r + 1, Bytes: total, Lines: lines}
		nodeID := fmt.Sprintf("bench-logs-%d", r+1)
		dataDir := filepath.Join(e.dir, "agent-"+nodeID)
		var raws []rawAttempt
		var outRoot string
		for i, c := range contents {
			runID := schemas.RunIDFor(fmt.Sprintf("logs-%s-%d-%d", nonce, r, i))
			dir, err := agent.PrepareOutput(dataDir, runID, schemas.WorkloadID(runID, 1))
			if err != nil {
				return nil, err
			}
			outRoot = filepath.Dir(dir)
			if err := nodelog.Write(nodelog.WriterSpec{Dir: dir}, [2]io.Reader{bytes.NewReader(c.out), bytes.NewReader(c.err)}, func() {}, time.Now); err != nil {
				return nil, err
			}
			ra, err := readChunks(dir)
			if err != nil {
				return nil, err
			}
			round.Chunks += len(ra.chunks[0]) + len(ra.chunks[1])
			raws = append(raws, ra)
		}
		// kind is raw, batch (16 then await all) or warm (raw, untimed).
		rawPhase := func(kind string) (phaseFig, error) {
			var p *profiler
			if last && kind == "raw" && o.profile == "raw" {
				p = prof
			}
			node, batch := "bench-raw-"+strconv.Itoa(r+1), kind == "batch"
			fig, err := storedPhase(ctx, stream, p, func() error {
				errs := make([]error, len(raws))
				var wg sync.WaitGroup
				for i, ra := range raws {
					runID := schemas.RunIDFor(fmt.Sprintf("logs-%s-%s-%d-%d", kind, nonce, r, i))
					wg.Go(func() { errs[i] = ra.publish(ctx, pub.JS, runID, node, batch) })
				}
				wg.Wait()
				return errors.Join(errs...)
			})
			return fig.phaseFig, err
		}
		agentPhase := func() (phaseFig, error) {
			var p *profiler
			if last && o.profile == "agent" {
				p = prof
			}
			counter := &shipCounter{}
			var t0 time.Time
			fig, err := storedPhase(ctx, stream, p, func() error {
				t0 = time.Now()
				_, stop, err := startAgent(e, agent.Config{NodeID: nodeID, Generation: 1, DataDir: dataDir, LogMetrics: counter, LogPoll: o.logPoll,
					Capacity: schemas.Resources{CPUMillis: 64_000, MemoryBytes: 256 << 30}}, noopruntime.New(noopruntime.Options{Images: []string{digest}}), nil)
				if err != nil {
					return err
				}
				defer stop()
				round.AgentEnrolledS = time.Since(t0).Seconds()
				if err := waitEmpty(ctx, outRoot, o.shipLimit); err != nil {
					return err
				}
				round.AgentAllGoneS = time.Since(t0).Seconds()
				return nil
			})
			if err != nil {
				return fig.phaseFig, err
			}
			round.ShippedBytes = counter.bytes
			if first, err := stream.GetMsg(ctx, fig.firstSeq); err == nil {
				round.AgentFirstChunkS = first.Time.Sub(t0).Seconds()
			}
			return fig.phaseFig, nil
		}
		if r == 0 {
			// Untimed: the first phase in a fresh server and process pays
			// for the store's first blocks and the heap's growth.
			if _, err := rawPhase("warm"); err != nil {
				return nil, fmt.Errorf("warm-up: %w", err)
			}
			if err := stream.Purge(ctx); err != nil {
				return nil, err
			}
		}
		order := []string{"raw", "agent"}
		if r%2 == 1 {
			order = []string{"agent", "raw"}
		}
		if o.batch {
			order = append(order, "batch")
		}
		round.Order = order
		for _, ph := range order {
			var fig phaseFig
			var err error
			switch ph {
			case "raw":
				fig, err = rawPhase("raw")
				round.Raw = fig
			case "batch":
				fig, err = rawPhase("batch")
				round.Batch = fig
			case "agent":
				fig, err = agentPhase()
				round.Agent = fig
			}
			if err != nil {
				return nil, fmt.Errorf("round %d, %s: %w", r+1, ph, err)
			}
			if err := stream.Purge(ctx); err != nil {
				return nil, err
			}
		}
		for _, f := range []*phaseFig{&round.Raw, &round.Agent, &round.Batch} {
			if f.WindowS > 0 {
				f.MiBPerS = float64(total) / (1 << 20) / f.WindowS
				f.LinesPerS = float64(lines) / f.WindowS
				f.CPUmsPerMB = f.CPUSeconds * 1000 / (float64(total) / (1 << 20))
			}
		}
		if round.Raw.MiBPerS > 0 {
			round.Ratio = round.Agent.MiBPerS / round.Raw.MiBPerS
		}
		if want := uint64(round.Chunks + 2*len(raws)); round.Raw.Stored != want || round.Agent.Stored != want || (o.batch && round.Batch.Stored != want) {
			return nil, fmt.Errorf("round %d: stored raw %d, agent %d, batch %d messages, want %d each", r+1, round.Raw.Stored, round.Agent.Stored, round.Batch.Stored, want)
		}
		if round.ShippedBytes != total {
			return nil, fmt.Errorf("round %d: the agent's metrics count %d bytes stored, %d were written", r+1, round.ShippedBytes, total)
		}
		res.rounds = append(res.rounds, round)
	}
	return res, nil
}

// storedFig is a phase's figures and where its messages start in WF_LOGS.
type storedFig struct {
	phaseFig
	firstSeq uint64
}

// storedPhase runs one phase (run returns once everything is stored) and
// times it by the server's store stamps of its first and last message;
// CPU is the process's over the whole phase.
func storedPhase(ctx context.Context, stream jetstream.Stream, prof *profiler, run func() error) (storedFig, error) {
	var fig storedFig
	info, err := stream.Info(ctx)
	if err != nil {
		return fig, err
	}
	from := info.State.LastSeq + 1
	if prof != nil {
		if err := prof.start(); err != nil {
			return fig, err
		}
	}
	cpu0, err := cpuSeconds(os.Getpid())
	if err != nil {
		return fig, err
	}
	t0 := time.Now()
	runErr := run()
	cpu1, _ := cpuSeconds(os.Getpid())
	fig.WallS = time.Since(t0).Seconds()
	if prof != nil {
		prof.stop()
	}
	if runErr != nil {
		return fig, runErr
	}
	fig.CPUSeconds = cpu1 - cpu0
	if info, err = stream.Info(ctx); err != nil {
		return fig, err
	}
	to := info.State.LastSeq
	if to < from {
		return fig, errors.New("nothing stored")
	}
	first, err := stream.GetMsg(ctx, from)
	if err != nil {
		return fig, fmt.Errorf("first message %d: %w", from, err)
	}
	lastMsg, err := stream.GetMsg(ctx, to)
	if err != nil {
		return fig, fmt.Errorf("last message %d: %w", to, err)
	}
	fig.firstSeq = from
	fig.Stored = to - from + 1
	fig.WindowS = lastMsg.Time.Sub(first.Time).Seconds()
	return fig, nil
}

// waitEmpty waits until dir holds nothing (the agent removed every output
// directory it stored).
func waitEmpty(ctx context.Context, dir string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if len(ents) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d output dirs still in %s after %s", len(ents), dir, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// shipCounter is the agent's LogMetrics: what it stored, what the writer
// dropped, and each chunk's lag from the writer to stored.
type shipCounter struct {
	mu                     sync.Mutex
	bytes, dropped, chunks int64
	lags                   []time.Duration
	behindMax              int64
}

func (c *shipCounter) Shipped(_ string, bytes, dropped int64, lag time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bytes += bytes
	c.dropped += dropped
	c.chunks++
	c.lags = append(c.lags, lag)
}

func (c *shipCounter) Behind(bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.behindMax = max(c.behindMax, bytes)
}

func (c *shipCounter) snapshot() (bytes, dropped, chunks int64, lags []time.Duration, behindMax int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes, c.dropped, c.chunks, append([]time.Duration(nil), c.lags...), c.behindMax
}

func (s *shipResult) report(rep *Report, o logsOpts) {
	var agentR, rawR, batchR, ratios, agentL, rawL, agentCPU, rawCPU, batchCPU, diff, first, gone, enrolled []float64
	for _, r := range s.rounds {
		agentR, rawR, batchR = append(agentR, r.Agent.MiBPerS), append(rawR, r.Raw.MiBPerS), append(batchR, r.Batch.MiBPerS)
		ratios = append(ratios, r.Ratio)
		agentL, rawL = append(agentL, r.Agent.LinesPerS), append(rawL, r.Raw.LinesPerS)
		agentCPU, rawCPU, batchCPU = append(agentCPU, r.Agent.CPUmsPerMB), append(rawCPU, r.Raw.CPUmsPerMB), append(batchCPU, r.Batch.CPUmsPerMB)
		diff = append(diff, r.Agent.CPUmsPerMB-r.Raw.CPUmsPerMB)
		first, gone, enrolled = append(first, r.AgentFirstChunkS), append(gone, r.AgentAllGoneS), append(enrolled, r.AgentEnrolledS)
	}
	rep.add(fmt.Sprintf("shipping throughput, one node, %d attempts at once", o.attempts), median(agentR), "MiB/s", median(rawR), "raw PublishMsgAsync, window 16")
	rep.add("shipping throughput, lines", median(agentL), "lines/s", median(rawL), "raw, same chunks")
	row := rep.add("agent ÷ raw, median of per-round ratios", median(ratios), "×", 0, "")
	row.goal("≥ 0.7", median(ratios) >= 0.7)
	if o.batch {
		rep.add("raw sending 16 then awaiting all 16 (the agent's pattern)", median(batchR), "MiB/s", median(rawR), "raw, sliding window of 16")
		rep.add("agent vs raw with the agent's pattern", median(agentR), "MiB/s", median(batchR), "raw, 16 then await all")
	}
	rep.add("process CPU per MiB, agent phase", median(agentCPU), "CPU-ms/MiB", median(rawCPU), "raw phase (server + bare publisher)")
	rep.add("agent CPU per MiB (agent phase − raw phase)", median(diff), "CPU-ms/MiB", 0, "")
	rep.add("agent start → enrolled", median(enrolled), "s", 0, "")
	rep.add("agent start → first chunk stored", median(first), "s", 0, "")
	rep.add("agent start → every output dir stored and removed", median(gone), "s", 0, "")
	rep.Details["ship_rounds"] = s.rounds
	if o.logPoll > 0 {
		rep.note("diagnosis: the throughput agent ran with LogPoll %s, not its default %s", o.logPoll, agent.DefaultLogPoll)
	}
	rep.Details["idle_process_cores"] = s.idle
	r0 := s.rounds[0]
	rep.note("throughput: %d MiB in %d attempts (%d lines, %d chunks, mean line %.0f B, 1/16 of lines on stderr), per phase and round; %d rounds, order alternating, median shown",
		r0.Bytes>>20, o.attempts, r0.Lines, r0.Chunks, float64(r0.Bytes)/float64(r0.Lines), len(s.rounds))
	rep.note("rates are over the server's store stamps, first message → last end message; the agent's start (connect, enroll, reconcile) is outside and shown apart")
	rep.note("CPU = getrusage(RUSAGE_SELF) of the whole bench process (NATS server, control plane, and the agent or raw publisher) over the phase, per MiB; idle process with the control plane alone: %.3f cores", s.idle)
	var ratioList []string
	for _, r := range s.rounds {
		ratioList = append(ratioList, fmt.Sprintf("%.2f (%s first)", r.Ratio, r.Order[0]))
	}
	rep.note("agent ÷ raw per round: %v", ratioList)
}
