package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/ctrdproc"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/internal/ociimage"
	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// floodLine is the flood's line: 100 bytes with its newline.
const floodLine = "flood step=000000 loss=0.123456 lr=0.0003 tok/s=123456 the quick brown fox jumps over the lazy dogs"

// floodMode resolves --flood; why says what auto fell back from.
func floodMode(flag string) (mode, why string, err error) {
	avail := func() error {
		if err := ctrdproc.Check(); err != nil {
			return err
		}
		if _, err := os.Stat(ociimage.BusyboxPath); err != nil {
			return fmt.Errorf("%s missing (apt-get install -y busybox-static)", ociimage.BusyboxPath)
		}
		return nil
	}
	switch flag {
	case "none", "writer":
		return flag, "", nil
	case "containerd":
		if err := avail(); err != nil {
			return "", "", fmt.Errorf("--flood containerd: %w", err)
		}
		return flag, "", nil
	case "auto":
		if err := avail(); err != nil {
			return "writer", fmt.Sprintf("flood: containerd unavailable (%v), so the bench wrote the flooding Run's output itself (--flood writer)", err), nil
		}
		return "containerd", "", nil
	}
	return "", "", fmt.Errorf("--flood %q: use containerd, writer, auto or none", flag)
}

// probeRuntime answers EnsureImage for the probe commands' digest at once
// and passes everything else to the runtime, so the timed command path is
// the agent's alone, as over the no-op runtime in rtt.
type probeRuntime struct {
	noderuntime.Runtime
	digest string
}

func (p probeRuntime) EnsureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	if spec.ManifestDigest == p.digest {
		return noderuntime.ImageResult{AlreadyPresent: true, Source: "local"}, nil
	}
	return p.Runtime.EnsureImage(ctx, spec)
}

// floodCase is one agent configuration: idle, then during one flood.
type floodCase struct {
	Name    string `json:"case"`
	LogRate int64  `json:"log_rate"`
	// Command round trips and core request/reply, timed in turn; idle is
	// half before the flood and half after, pooled.
	IdleCmd  Latencies `json:"idle_command"`
	FloodCmd Latencies `json:"flood_command"`
	IdleRR   Latencies `json:"idle_request_reply"`
	FloodRR  Latencies `json:"flood_request_reply"`
	// The command round trip's idle halves apart, for drift.
	IdleBefore Latencies `json:"idle_command_before"`
	IdleAfter  Latencies `json:"idle_command_after"`
	// TimedS is how long the flood samples took; RunS the Run's running →
	// terminal time (its events).
	TimedS float64 `json:"timed_flood_s"`
	RunS   float64 `json:"run_running_to_done_s"`
	// From the agent's LogMetrics: bytes stored (drop markers included),
	// bytes the writer dropped, each chunk's writer → stored lag, and the
	// largest backlog it reported.
	Kept      int64     `json:"kept_bytes"`
	Dropped   int64     `json:"dropped_bytes"`
	Lag       Latencies `json:"ship_lag"`
	BehindMax int64     `json:"max_backlog_bytes"`
	// Busy cores (all processes, /proc/stat) and this process's, idle and
	// flooding.
	IdleMachineCores  float64 `json:"idle_machine_cores"`
	FloodMachineCores float64 `json:"flood_machine_cores"`
	IdleProcCores     float64 `json:"idle_process_cores"`
	FloodProcCores    float64 `json:"flood_process_cores"`
	// WriterCores is the Run's log writer process's CPU over the flood
	// window (containerd; with --flood writer it is in this process).
	WriterCores float64 `json:"log_writer_cores"`
	// Control: the same workload writing to /dev/null in its container.
	Control *floodControl `json:"control,omitempty"`
}

// floodControl is the round trips while the flooding workload runs with its
// output discarded: its CPU without its log.
type floodControl struct {
	Cmd          Latencies `json:"command"`
	RR           Latencies `json:"request_reply"`
	TimedS       float64   `json:"timed_s"`
	MachineCores float64   `json:"machine_cores"`
	ProcCores    float64   `json:"process_cores"`
	WriterCores  float64   `json:"log_writer_cores"`
}

type floodResult struct{ cases []floodCase }

func floodRoundTrips(ctx context.Context, g *globals, o logsOpts, mode string, prof *profiler) (*floodResult, error) {
	var cd *benchContainerd
	var img ociimage.Image
	if mode == "containerd" {
		var err error
		if cd, err = startContainerd("nolimit"); err != nil {
			return nil, err
		}
		defer cd.stop()
		imgDir := filepath.Join(cd.Dir, "images")
		if err := os.MkdirAll(imgDir, 0o755); err != nil {
			return nil, err
		}
		if img, err = ociimage.BuildBusybox(imgDir, "bench-logs", nil); err != nil {
			return nil, err
		}
	}
	res := &floodResult{}
	for _, c := range []struct {
		name, ns string
		rate     int64
		profile  string
	}{
		{"limit 1 MiB/s (default)", "", 0, "flood"},
		{"limit off", "nolimit", -1, "flood-nolimit"},
	} {
		var p *profiler
		if o.profile == c.profile {
			p = prof
		}
		fc, err := floodOnce(ctx, g, o, mode, cd, img, c.ns, c.name, c.rate, o.control && len(res.cases) == 0, p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		res.cases = append(res.cases, fc)
	}
	return res, nil
}

func floodOnce(ctx context.Context, g *globals, o logsOpts, mode string, cd *benchContainerd, img ociimage.Image, ns, name string, rate int64, control bool, prof *profiler) (floodCase, error) {
	e, err := startEnv(g, "logs-flood", controlplane.Config{HeartbeatInterval: time.Second, OpenEnrollment: true})
	if err != nil {
		return floodCase{Name: name, LogRate: rate}, err
	}
	defer e.close()
	f := &floodBench{o: o, mode: mode, rate: rate, e: e, counter: &shipCounter{}, nonce: strconv.FormatInt(time.Now().UnixNano(), 36)}
	defer f.cleanup.run()
	if err := f.start(ctx, cd, img, ns); err != nil {
		return floodCase{Name: name, LogRate: rate}, err
	}
	return f.measure(ctx, name, control, prof)
}

// floodBench is one flood case's world: an agent (its output limit rate),
// the client that submits the flooding Run and follows it, and the round
// trips timed in turn: core request/reply and the command.
type floodBench struct {
	o       logsOpts
	mode    string
	rate    int64
	e       *env
	cfg     agent.Config
	image   string // the flooding Run's
	counter *shipCounter
	client  *bus.Conn
	w       *runWatch
	base    *probe
	cmds    *commandProbe
	next    int // the next sample's number
	nonce   string
	cleanup undo
}

// probeDigest is the probe commands' image, answered at once.
var probeDigest = benchDigest("logs-probe")

// start starts the agent, warms containerd up with one Run, and the round
// trips with --warmup untimed samples.
func (f *floodBench) start(ctx context.Context, cd *benchContainerd, img ociimage.Image, ns string) error {
	ag, err := f.startAgent(cd, img, ns)
	if err != nil {
		return err
	}
	if f.client, err = f.e.connect("bench-client"); err != nil {
		return err
	}
	if f.w, err = watchRuns(f.client.NC); err != nil {
		return err
	}
	f.cleanup.push(f.w.stop)
	if f.mode == "containerd" {
		// Untimed: the image is imported and a first container started.
		rid := "logs-warm-" + f.nonce
		req := runRequest(rid, f.image)
		req.Command = []string{"true"}
		end, err := f.w.run(ctx, f.client.JS, req, 120*time.Second)
		if err != nil {
			return err
		}
		if err := end.succeeded(rid, f.logPath()); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	enr := ag.Enrollment()
	sample, err := codec.Encode(codec.MsgPack, rttCommand(f.cfg.NodeID, enr, "bench-rtt-sample-000000", probeDigest))
	if err != nil {
		return err
	}
	if f.base, err = requestReply(f.e, f.client, len(sample)); err != nil {
		return err
	}
	f.cleanup.push(f.base.close)
	if f.cmds, err = commandRTT(f.client, f.cfg.NodeID, enr, probeDigest); err != nil {
		return err
	}
	f.cleanup.push(f.cmds.close)
	_, err = sampleWhile(ctx, &f.next, f.o.warmup, 0, nil, f.base.roundTrip, f.cmds.roundTrip)
	return err
}

// startAgent starts the agent: on containerd, its runtime wrapped so the
// probes' image is answered at once; on the no-op runtime for the writer
// mode, whose flooding Run "exits" once the bench's writer has stopped.
func (f *floodBench) startAgent(cd *benchContainerd, img ociimage.Image, ns string) (*agent.Agent, error) {
	nodeID := "bench-flood-" + strconv.FormatInt(max(f.rate, 0), 10)
	if f.rate < 0 {
		nodeID = "bench-flood-nolimit"
	}
	f.cfg = agent.Config{NodeID: nodeID, Generation: 1, DataDir: filepath.Join(f.e.dir, "agent-"+nodeID), LogRate: f.rate, LogMetrics: f.counter}
	var (
		ag   *agent.Agent
		stop func()
		err  error
	)
	switch f.mode {
	case "containerd":
		f.image = img.Reference
		ag, stop, err = startContainerdAgent(f.e, cd, filepath.Join(cd.Dir, "images"), cd.Namespace+suffix(ns), f.cfg,
			func(rt noderuntime.Runtime) noderuntime.Runtime {
				return probeRuntime{Runtime: rt, digest: probeDigest}
			})
	case "writer":
		runDigest := benchDigest("logs-flood")
		f.image = "localhost/bench@" + runDigest
		f.cfg.Capacity = benchCapacity
		ag, stop, err = startAgent(f.e, f.cfg, noopruntime.New(noopruntime.Options{Images: []string{runDigest, probeDigest}, ExitAfter: f.o.floodFor + time.Second}), nil)
	}
	if err != nil {
		return nil, err
	}
	f.cleanup.push(stop)
	return ag, nil
}

func (f *floodBench) logPath() string { return filepath.Join(f.e.dir, "cp.log") }

// measure times the idle round trips (half before the flood, half after),
// those during the flood and, with control, during the same workload with
// its output discarded.
func (f *floodBench) measure(ctx context.Context, name string, control bool, prof *profiler) (floodCase, error) {
	fc := floodCase{Name: name, LogRate: f.rate}
	var idle [2]sampledWindow
	var err error
	if idle[0], err = f.window(ctx, (f.o.samples+1)/2, nil); err != nil {
		return fc, err
	}
	fl, err := f.loaded(ctx, "logs-flood-"+f.nonce, f.script(), prof, f.mode == "writer")
	if err != nil {
		return fc, err
	}
	fc.FloodRR, fc.FloodCmd, fc.TimedS, fc.FloodMachineCores, fc.FloodProcCores, fc.WriterCores = fl.rr, fl.cmd, fl.secs, fl.machine, fl.proc, fl.writer
	for p, at := range fl.phases {
		if p.Terminal() {
			fc.RunS = at.Sub(fl.phases[schemas.PhaseRunning]).Seconds()
		}
	}
	var lags []time.Duration
	fc.Kept, fc.Dropped, _, lags, fc.BehindMax = f.counter.snapshot()
	fc.Lag = summarise(lags)
	if control && f.mode == "containerd" {
		// The same workload with its output thrown away in the container:
		// the CPU it burns, without a byte for the writer or the agent.
		c, err := f.loaded(ctx, "logs-control-"+f.nonce, "exec >/dev/null 2>&1; "+f.script(), nil, false)
		if err != nil {
			return fc, fmt.Errorf("control: %w", err)
		}
		fc.Control = &floodControl{Cmd: c.cmd, RR: c.rr, TimedS: c.secs, MachineCores: c.machine, ProcCores: c.proc, WriterCores: c.writer}
	}
	if idle[1], err = f.window(ctx, f.o.samples/2, nil); err != nil {
		return fc, err
	}
	fc.IdleBefore, fc.IdleAfter = summarise(idle[0].cmd), summarise(idle[1].cmd)
	fc.IdleRR, fc.IdleCmd = summarise(append(idle[0].rr, idle[1].rr...)), summarise(append(idle[0].cmd, idle[1].cmd...))
	t := idle[0].secs + idle[1].secs
	fc.IdleMachineCores = (idle[0].machine*idle[0].secs + idle[1].machine*idle[1].secs) / t
	fc.IdleProcCores = (idle[0].proc*idle[0].secs + idle[1].proc*idle[1].secs) / t
	return fc, nil
}

// sampledWindow is one stretch of round trips, with the machine's and
// this process's busy cores over it.
type sampledWindow struct {
	rr, cmd             []time.Duration
	secs, machine, proc float64
}

// window times n samples of both round trips, fewer if more (when not
// nil) says stop, with the machine's and this process's CPU over them.
func (f *floodBench) window(ctx context.Context, n int, more func() bool) (sampledWindow, error) {
	m0, err := machineBusy()
	if err != nil {
		return sampledWindow{}, err
	}
	meter, err := startMeter(os.Getpid())
	if err != nil {
		return sampledWindow{}, err
	}
	t0 := time.Now()
	lat, err := sampleWhile(ctx, &f.next, n, f.o.pace, more, f.base.roundTrip, f.cmds.roundTrip)
	if err != nil {
		return sampledWindow{}, err
	}
	w := sampledWindow{rr: lat[0], cmd: lat[1], secs: time.Since(t0).Seconds()}
	w.proc, _ = meter.cores()
	m1, _ := machineBusy()
	w.machine = (m1 - m0) / w.secs
	return w, nil
}

// floodCapMiB is where the flood stops: with the limit off --flood-mib,
// else no cap (the time ends it).
func (f *floodBench) floodCapMiB() int {
	if f.rate < 0 {
		return f.o.floodMiB
	}
	return 1 << 30
}

// script is the flooding Run's: busybox yes of floodLine in 16 MiB
// batches for --flood-for, at most floodCapMiB.
func (f *floodBench) script() string {
	floodSecs := int(max(1, f.o.floodFor.Round(time.Second)/time.Second))
	return fmt.Sprintf(`line='%s'; end=$(($(date +%%s)+%d)); k=0; while [ $(date +%%s) -lt $end ] && [ $k -lt %d ]; do yes "$line" | head -c 16777216; k=$((k+1)); done; echo "flood: $k x 16 MiB" >&2`,
		floodLine, floodSecs, (f.floodCapMiB()+15)/16)
}

// floodWindow is the round trips timed while one Run ran, and its phases.
type floodWindow struct {
	rr, cmd                     Latencies
	secs, machine, proc, writer float64
	phases                      map[schemas.Phase]time.Time
}

// loaded runs one Run of script and times round trips from --settle after
// it is running until it ends. benchWrites: the bench is the Run's log
// writer (writer mode).
func (f *floodBench) loaded(ctx context.Context, rid, script string, prof *profiler, benchWrites bool) (floodWindow, error) {
	var fw floodWindow
	req := runRequest(rid, f.image)
	req.Resources.MemoryBytes = 64 << 20
	req.Command = []string{"sh", "-c", script}
	if f.mode == "containerd" {
		req.Resources.CPUMillis = f.o.floodCPU
	}
	_, runID, err := submitRun(ctx, f.client.JS, req)
	if err != nil {
		return fw, err
	}
	if benchWrites {
		wait, err := f.writeOutput(ctx, runID)
		if err != nil {
			return fw, err
		}
		defer wait()
	}
	if err := f.w.waitPhase(ctx, runID, schemas.PhaseRunning, 60*time.Second); err != nil {
		return fw, err
	}
	time.Sleep(f.o.settle)
	if prof != nil {
		if err := prof.start(); err != nil {
			return fw, err
		}
	}
	// The Run's log writer: a process of its own on containerd.
	writers := watchProcs(50*time.Millisecond, nodelog.WriterFlag, filepath.Base(f.e.dir))
	w, err := f.window(ctx, 4*f.o.samples, func() bool { return !f.w.terminal(runID) })
	fw.writer = writers.cores()
	fw.rr, fw.cmd, fw.secs, fw.machine, fw.proc = summarise(w.rr), summarise(w.cmd), w.secs, w.machine, w.proc
	if prof != nil {
		prof.stop()
	}
	if err != nil {
		return fw, err
	}
	end, err := f.w.waitTerminal(ctx, runID, 180*time.Second)
	if err != nil {
		return fw, err
	}
	fw.phases = end.phases
	return fw, end.succeeded(rid, f.logPath())
}

// writeOutput writes the Run's output directory as the shim's log writer
// would, from an in-memory flood at --writer-mibps, with the limit the
// agent hands its runtime; wait waits for the writer to end.
func (f *floodBench) writeOutput(ctx context.Context, runID string) (wait func(), err error) {
	dir := filepath.Join(f.cfg.DataDir, "output", schemas.WorkloadID(runID, 1))
	if err := waitFile(ctx, filepath.Join(dir, "meta.json"), 60*time.Second); err != nil {
		return nil, err
	}
	// agent.New's defaults.
	limit := nodelog.Limit{BytesPerSecond: agent.DefaultLogRate, Burst: agent.DefaultLogBurst}
	if f.rate != 0 {
		limit.BytesPerSecond = max(f.rate, 0)
	}
	writeErr := make(chan error, 1)
	go func() {
		fr := newFloodReader(f.o.floodFor, int64(f.floodCapMiB())<<20, float64(f.o.writerMiBs)*(1<<20))
		writeErr <- nodelog.Write(nodelog.WriterSpec{Dir: dir, Limit: limit}, [2]io.Reader{fr, strings.NewReader("")}, func() {}, time.Now)
	}()
	return func() { <-writeErr }, nil
}

func suffix(ns string) string {
	if ns == "" {
		return ""
	}
	return "-" + ns
}

// waitFile waits until path exists.
func waitFile(ctx context.Context, path string, within time.Duration) error {
	return poll(ctx, 5*time.Millisecond, time.Now().Add(within), func() (bool, error) {
		_, err := os.Stat(path)
		return err == nil, nil
	}, func() error { return fmt.Errorf("%s not there after %s", path, within) })
}
