package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/schemas"
)

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

func shipThroughput(ctx context.Context, g *globals, o logsOpts, prof *profiler) (*shipResult, error) {
	e, err := startEnv(g, "logs", controlplane.Config{HeartbeatInterval: time.Second, OpenEnrollment: true})
	if err != nil {
		return nil, err
	}
	defer e.close()
	s, err := newShipBench(ctx, e, o, prof)
	if err != nil {
		return nil, err
	}
	res := &shipResult{}
	// What the process burns with the control plane up and nothing to do.
	idle, err := startMeter(os.Getpid())
	if err != nil {
		return nil, err
	}
	time.Sleep(time.Second)
	res.idle, _ = idle.cores()
	for r := range o.rounds {
		round, err := s.round(ctx, r)
		if err != nil {
			return nil, err
		}
		res.rounds = append(res.rounds, round)
	}
	return res, nil
}

// shipBench is the throughput rounds' world: NATS with the control plane,
// the raw publisher's connection, WF_LOGS, and the output every round
// writes.
type shipBench struct {
	o            logsOpts
	e            *env
	prof         *profiler
	pub          *bus.Conn
	stream       jetstream.Stream
	contents     []attemptContent
	lines, total int64
	nonce        string
	digest       string // the no-op runtime's image
}

func newShipBench(ctx context.Context, e *env, o logsOpts, prof *profiler) (*shipBench, error) {
	pub, err := e.connect("bench-raw-publisher")
	if err != nil {
		return nil, err
	}
	stream, err := pub.JS.Stream(ctx, bus.StreamLogs)
	if err != nil {
		return nil, err
	}
	s := &shipBench{o: o, e: e, prof: prof, pub: pub, stream: stream, contents: make([]attemptContent, o.attempts),
		nonce: strconv.FormatInt(time.Now().UnixNano(), 36), digest: benchDigest("logs")}
	per := int64(o.mib) << 20 / int64(o.attempts)
	for i := range s.contents {
		s.contents[i] = genContent(uint64(i+1), per, o.meanLine)
		s.lines += s.contents[i].lines
		s.total += int64(len(s.contents[i].out) + len(s.contents[i].err))
	}
	return s, nil
}

// shipOutputs is one round's output directories, as the agent finds them
// in its data dir and as the raw publisher sends them (their chunks).
type shipOutputs struct {
	round           int // from 0
	nodeID, dataDir string
	outRoot         string
	raws            []rawAttempt
	chunks          int
}

// outputs writes every attempt's content into a fresh output directory of
// round r's agent, with the log writer's own code, and reads the chunks
// back.
func (s *shipBench) outputs(r int) (*shipOutputs, error) {
	out := &shipOutputs{round: r, nodeID: fmt.Sprintf("bench-logs-%d", r+1)}
	out.dataDir = filepath.Join(s.e.dir, "agent-"+out.nodeID)
	for i, c := range s.contents {
		runID := schemas.RunIDFor(schemas.DefaultTenant, fmt.Sprintf("logs-%s-%d-%d", s.nonce, r, i))
		dir, err := agent.PrepareOutput(out.dataDir, schemas.DefaultTenant, runID, schemas.WorkloadID(runID, 1))
		if err != nil {
			return nil, err
		}
		out.outRoot = filepath.Dir(dir)
		if err := nodelog.Write(nodelog.WriterSpec{Dir: dir}, [2]io.Reader{bytes.NewReader(c.out), bytes.NewReader(c.err)}, func() {}, time.Now); err != nil {
			return nil, err
		}
		ra, err := readChunks(dir)
		if err != nil {
			return nil, err
		}
		out.chunks += len(ra.chunks[0]) + len(ra.chunks[1])
		out.raws = append(out.raws, ra)
	}
	return out, nil
}

// round runs one throughput round: raw and agent in the order of the
// round (then batch), WF_LOGS purged after each.
func (s *shipBench) round(ctx context.Context, r int) (shipRound, error) {
	round := shipRound{Round: r + 1, Bytes: s.total, Lines: s.lines}
	out, err := s.outputs(r)
	if err != nil {
		return round, err
	}
	round.Chunks = out.chunks
	if r == 0 {
		// Untimed: the first phase in a fresh server and process pays
		// for the store's first blocks and the heap's growth.
		if _, err := s.rawPhase(ctx, out, "warm"); err != nil {
			return round, fmt.Errorf("warm-up: %w", err)
		}
		if err := s.stream.Purge(ctx); err != nil {
			return round, err
		}
	}
	round.Order = []string{"raw", "agent"}
	if r%2 == 1 {
		round.Order = []string{"agent", "raw"}
	}
	if s.o.batch {
		round.Order = append(round.Order, "batch")
	}
	for _, ph := range round.Order {
		var err error
		switch ph {
		case "raw":
			round.Raw, err = s.rawPhase(ctx, out, "raw")
		case "batch":
			round.Batch, err = s.rawPhase(ctx, out, "batch")
		case "agent":
			round.Agent, err = s.agentPhase(ctx, out, &round)
		}
		if err != nil {
			return round, fmt.Errorf("round %d, %s: %w", r+1, ph, err)
		}
		if err := s.stream.Purge(ctx); err != nil {
			return round, err
		}
	}
	round.rates(s.total, s.lines)
	return round, round.check(s.o.batch, uint64(out.chunks+2*len(out.raws)), s.total)
}

// profiled is the profiler for phase of round r: the last round's phase
// --profile-phase names, none for any other.
func (s *shipBench) profiled(r int, phase string) *profiler {
	if r == s.o.rounds-1 && s.o.profile == phase {
		return s.prof
	}
	return nil
}

// rawPhase publishes every attempt's chunks at once, one goroutine each;
// kind is raw, batch (16 then await all) or warm (raw, untimed).
func (s *shipBench) rawPhase(ctx context.Context, out *shipOutputs, kind string) (phaseFig, error) {
	var p *profiler
	if kind == "raw" {
		p = s.profiled(out.round, "raw")
	}
	node, batch := "bench-raw-"+strconv.Itoa(out.round+1), kind == "batch"
	fig, err := storedPhase(ctx, s.stream, p, func() error {
		errs := make([]error, len(out.raws))
		var wg sync.WaitGroup
		for i, ra := range out.raws {
			runID := schemas.RunIDFor(schemas.DefaultTenant, fmt.Sprintf("logs-%s-%s-%d-%d", kind, s.nonce, out.round, i))
			wg.Go(func() { errs[i] = ra.publish(ctx, s.pub.JS, runID, node, batch) })
		}
		wg.Wait()
		return errors.Join(errs...)
	})
	return fig.phaseFig, err
}

// agentPhase starts a real agent on the round's data dir and waits until
// it has shipped and removed every output directory.
func (s *shipBench) agentPhase(ctx context.Context, out *shipOutputs, round *shipRound) (phaseFig, error) {
	counter := &shipCounter{}
	var t0 time.Time
	fig, err := storedPhase(ctx, s.stream, s.profiled(out.round, "agent"), func() error {
		t0 = time.Now()
		_, stop, err := startAgent(s.e, agent.Config{NodeID: out.nodeID, Generation: 1, DataDir: out.dataDir, LogMetrics: counter, LogPoll: s.o.logPoll,
			Capacity: benchCapacity}, noopruntime.New(noopruntime.Options{Images: []string{s.digest}}), nil)
		if err != nil {
			return err
		}
		defer stop()
		round.AgentEnrolledS = time.Since(t0).Seconds()
		if err := waitEmpty(ctx, out.outRoot, s.o.shipLimit); err != nil {
			return err
		}
		round.AgentAllGoneS = time.Since(t0).Seconds()
		return nil
	})
	if err != nil {
		return fig.phaseFig, err
	}
	round.ShippedBytes = counter.bytes
	if first, err := s.stream.GetMsg(ctx, fig.firstSeq); err == nil {
		round.AgentFirstChunkS = first.Time.Sub(t0).Seconds()
	}
	return fig.phaseFig, nil
}

// rates fills each phase's rates over its window and CPU per MiB.
func (round *shipRound) rates(total, lines int64) {
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
}

// check fails a round where a phase stored other than want messages, or
// the agent counted other than total bytes stored.
func (round *shipRound) check(batch bool, want uint64, total int64) error {
	if round.Raw.Stored != want || round.Agent.Stored != want || (batch && round.Batch.Stored != want) {
		return fmt.Errorf("round %d: stored raw %d, agent %d, batch %d messages, want %d each", round.Round, round.Raw.Stored, round.Agent.Stored, round.Batch.Stored, want)
	}
	if round.ShippedBytes != total {
		return fmt.Errorf("round %d: the agent's metrics count %d bytes stored, %d were written", round.Round, round.ShippedBytes, total)
	}
	return nil
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
	var left int
	return poll(ctx, 10*time.Millisecond, time.Now().Add(within), func() (bool, error) {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, err
		}
		left = len(ents)
		return left == 0, nil
	}, func() error { return fmt.Errorf("%d output dirs still in %s after %s", left, dir, within) })
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
