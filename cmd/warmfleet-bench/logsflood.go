package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/agent"
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
	fc := floodCase{Name: name, LogRate: rate}
	e, err := newEnv(g, "logs-flood")
	if err != nil {
		return fc, err
	}
	defer e.close()
	if err := e.startCP(controlplane.Config{HeartbeatInterval: time.Second, OpenEnrollment: true}); err != nil {
		return fc, err
	}
	nodeID := "bench-flood-" + strconv.FormatInt(max(rate, 0), 10)
	if rate < 0 {
		nodeID = "bench-flood-nolimit"
	}
	probeDigest := benchDigest("logs-probe")
	counter := &shipCounter{}
	cfg := agent.Config{NodeID: nodeID, Generation: 1, DataDir: filepath.Join(e.dir, "agent-"+nodeID), LogRate: rate, LogMetrics: counter}
	floodSecs := int(max(1, o.floodFor.Round(time.Second)/time.Second))
	var (
		ag        *agent.Agent
		stopAgent func()
		image     string
	)
	switch mode {
	case "containerd":
		image = img.Reference
		ag, stopAgent, err = startContainerdAgent(e, cd, filepath.Join(cd.Dir, "images"), cd.Namespace+suffix(ns), cfg,
			func(rt noderuntime.Runtime) noderuntime.Runtime {
				return probeRuntime{Runtime: rt, digest: probeDigest}
			})
	case "writer":
		runDigest := benchDigest("logs-flood")
		image = "localhost/bench@" + runDigest
		cfg.Capacity = schemas.Resources{CPUMillis: 64_000, MemoryBytes: 256 << 30}
		// The workload "exits" once the bench's writer has stopped.
		ag, stopAgent, err = startAgent(e, cfg, noopruntime.New(noopruntime.Options{Images: []string{runDigest, probeDigest}, ExitAfter: o.floodFor + time.Second}), nil)
	}
	if err != nil {
		return fc, err
	}
	defer stopAgent()
	client, err := e.connect("bench-client")
	if err != nil {
		return fc, err
	}
	w, err := watchRuns(client.NC)
	if err != nil {
		return fc, err
	}
	defer func() { _ = w.sub.Unsubscribe() }()
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	submit := func(rid string, req schemas.RunRequest) (string, error) {
		m, err := submitMsg(req, codec.JSON)
		if err != nil {
			return "", err
		}
		if _, err := client.JS.PublishMsg(ctx, m, jetstream.WithMsgID(rid)); err != nil {
			return "", err
		}
		return schemas.RunIDFor(rid), nil
	}
	if mode == "containerd" {
		// Untimed: the image is imported and a first container started.
		rid := "logs-warm-" + nonce
		req := runRequest(rid, image)
		req.Command = []string{"true"}
		runID, err := submit(rid, req)
		if err != nil {
			return fc, err
		}
		if ph, _, _, err := w.waitTerminal(ctx, runID, 120*time.Second); err != nil {
			return fc, err
		} else if _, ok := ph[schemas.PhaseSucceeded]; !ok {
			return fc, fmt.Errorf("warm-up Run did not succeed (phases %v); see %s", keys(ph), filepath.Join(e.dir, "cp.log"))
		}
	}

	enr := ag.Enrollment()
	sample, err := codec.Encode(codec.MsgPack, rttCommand(nodeID, enr, "bench-rtt-sample-000000", probeDigest))
	if err != nil {
		return fc, err
	}
	base, err := requestReply(e, client, len(sample))
	if err != nil {
		return fc, err
	}
	defer base.close()
	cmds, err := commandRTT(client, nodeID, enr, probeDigest)
	if err != nil {
		return fc, err
	}
	defer cmds.close()
	next := 0
	if _, err := sampleWhile(ctx, &next, o.warmup, 0, nil, base.roundTrip, cmds.roundTrip); err != nil {
		return fc, err
	}
	// window times n samples of both round trips, fewer if more (when not
	// nil) says stop, with the machine's and this process's CPU over them.
	window := func(n int, more func() bool) (rr, cmd []time.Duration, secs, machine, proc float64, err error) {
		m0, err := machineBusy()
		if err != nil {
			return
		}
		meter, err := startMeter(os.Getpid())
		if err != nil {
			return
		}
		t0 := time.Now()
		lat, err := sampleWhile(ctx, &next, n, o.pace, more, base.roundTrip, cmds.roundTrip)
		if err != nil {
			return
		}
		secs = time.Since(t0).Seconds()
		proc, _ = meter.cores()
		m1, _ := machineBusy()
		return lat[0], lat[1], secs, (m1 - m0) / secs, proc, nil
	}
	// Idle: half the samples before the flood, half after, pooled.
	var idle [2]idleWindow
	if idle[0].rr, idle[0].cmd, idle[0].secs, idle[0].machine, idle[0].proc, err = window((o.samples+1)/2, nil); err != nil {
		return fc, err
	}

	capMiB := 1 << 30 // no cap: the time ends it
	if rate < 0 {
		capMiB = o.floodMiB
	}
	script := fmt.Sprintf(`line='%s'; end=$(($(date +%%s)+%d)); k=0; while [ $(date +%%s) -lt $end ] && [ $k -lt %d ]; do yes "$line" | head -c 16777216; k=$((k+1)); done; echo "flood: $k x 16 MiB" >&2`,
		floodLine, floodSecs, (capMiB+15)/16)
	// loaded runs one Run of script and times round trips from o.settle
	// after it is running until it ends.
	loaded := func(rid, script string, prof *profiler, benchWrites bool) (rr, cmd Latencies, secs, machine, proc, writer float64, ph map[schemas.Phase]time.Time, err error) {
		var rrs, cmds []time.Duration
		req := runRequest(rid, image)
		req.Resources.MemoryBytes = 64 << 20
		req.Command = []string{"sh", "-c", script}
		if mode == "containerd" {
			req.Resources.CPUMillis = o.floodCPU
		}
		runID, err := submit(rid, req)
		if err != nil {
			return
		}
		if benchWrites {
			// The bench is the Run's log writer, as the shim's would be.
			dir := filepath.Join(cfg.DataDir, "output", schemas.WorkloadID(runID, 1))
			if err = waitFile(ctx, filepath.Join(dir, "meta.json"), 60*time.Second); err != nil {
				return
			}
			// The limit the agent hands its runtime (agent.New's defaults).
			limit := nodelog.Limit{BytesPerSecond: agent.DefaultLogRate, Burst: agent.DefaultLogBurst}
			if rate != 0 {
				limit.BytesPerSecond = max(rate, 0)
			}
			writeErr := make(chan error, 1)
			go func() {
				fr := newFloodReader(o.floodFor, int64(capMiB)<<20, float64(o.writerMiBs)*(1<<20))
				writeErr <- nodelog.Write(nodelog.WriterSpec{Dir: dir, Limit: limit}, [2]io.Reader{fr, strings.NewReader("")}, func() {}, time.Now)
			}()
			defer func() { <-writeErr }()
		}
		if err = w.waitPhase(ctx, runID, schemas.PhaseRunning, 60*time.Second); err != nil {
			return
		}
		time.Sleep(o.settle)
		if prof != nil {
			if err = prof.start(); err != nil {
				return
			}
		}
		// The Run's log writer: a process of its own on containerd.
		writers := watchProcs(50*time.Millisecond, nodelog.WriterFlag, filepath.Base(e.dir))
		rrs, cmds, secs, machine, proc, err = window(4*o.samples, func() bool { return !w.terminal(runID) })
		writer = writers.cores()
		rr, cmd = summarise(rrs), summarise(cmds)
		if prof != nil {
			prof.stop()
		}
		if err != nil {
			return
		}
		if ph, _, _, err = w.waitTerminal(ctx, runID, 180*time.Second); err != nil {
			return
		}
		if _, ok := ph[schemas.PhaseSucceeded]; !ok {
			err = fmt.Errorf("run %s did not succeed (phases %v); see %s", rid, keys(ph), filepath.Join(e.dir, "cp.log"))
		}
		return
	}

	// The flood.
	var ph map[schemas.Phase]time.Time
	fc.FloodRR, fc.FloodCmd, fc.TimedS, fc.FloodMachineCores, fc.FloodProcCores, fc.WriterCores, ph, err = loaded("logs-flood-"+nonce, script, prof, mode == "writer")
	if err != nil {
		return fc, err
	}
	for p, at := range ph {
		if p.Terminal() {
			fc.RunS = at.Sub(ph[schemas.PhaseRunning]).Seconds()
		}
	}
	var lags []time.Duration
	fc.Kept, fc.Dropped, _, lags, fc.BehindMax = counter.snapshot()
	fc.Lag = summarise(lags)

	if control && mode == "containerd" {
		// The same workload with its output thrown away in the container:
		// the CPU it burns, without a byte for the writer or the agent.
		c := &floodControl{}
		if c.RR, c.Cmd, c.TimedS, c.MachineCores, c.ProcCores, c.WriterCores, _, err = loaded("logs-control-"+nonce, "exec >/dev/null 2>&1; "+script, nil, false); err != nil {
			return fc, fmt.Errorf("control: %w", err)
		}
		fc.Control = c
	}
	if idle[1].rr, idle[1].cmd, idle[1].secs, idle[1].machine, idle[1].proc, err = window(o.samples/2, nil); err != nil {
		return fc, err
	}
	fc.IdleBefore, fc.IdleAfter = summarise(idle[0].cmd), summarise(idle[1].cmd)
	fc.IdleRR, fc.IdleCmd = summarise(append(idle[0].rr, idle[1].rr...)), summarise(append(idle[0].cmd, idle[1].cmd...))
	t := idle[0].secs + idle[1].secs
	fc.IdleMachineCores = (idle[0].machine*idle[0].secs + idle[1].machine*idle[1].secs) / t
	fc.IdleProcCores = (idle[0].proc*idle[0].secs + idle[1].proc*idle[1].secs) / t
	return fc, nil
}

// idleWindow is one idle stretch of round trips.
type idleWindow struct {
	rr, cmd             []time.Duration
	secs, machine, proc float64
}

func suffix(ns string) string {
	if ns == "" {
		return ""
	}
	return "-" + ns
}

// sampleWhile takes one of each round trip in turn (rotating which goes
// first) per sample, n samples or until more says stop (checked before
// each), numbering them from *next on.
func sampleWhile(ctx context.Context, next *int, n int, pace time.Duration, more func() bool, rts ...roundTrip) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(rts))
	for s := 0; s < n && (more == nil || more()); s++ {
		i := *next
		*next++
		for j := range rts {
			k := (i + j) % len(rts)
			if pace > 0 {
				time.Sleep(pace)
			}
			d, err := rts[k].once(ctx, i)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", rts[k].name, err)
			}
			out[k] = append(out[k], d)
		}
	}
	return out, nil
}

// terminal says whether the Run has reached a terminal phase.
func (w *runWatch) terminal(runID string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for p := range w.phases[runID] {
		if p.Terminal() {
			return true
		}
	}
	return false
}

// waitPhase waits until the Run has reached phase p (or ended).
func (w *runWatch) waitPhase(ctx context.Context, runID string, p schemas.Phase, within time.Duration) error {
	deadline := time.After(within)
	for {
		w.mu.Lock()
		_, ok := w.phases[runID][p]
		w.mu.Unlock()
		if ok {
			return nil
		}
		if w.terminal(runID) {
			return fmt.Errorf("run %s ended before %s", runID, p)
		}
		select {
		case <-w.cond:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			return fmt.Errorf("run %s not %s after %s", runID, p, within)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func waitFile(ctx context.Context, path string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not there after %s", path, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// floodReader hands out floodLine, numbered, at most 64 KiB a read (as a
// pipe does) and at most rate bytes a second, until its time or its bytes
// run out.
type floodReader struct {
	buf   []byte
	pos   int
	start time.Time
	until time.Time
	rate  float64
	read  int64
	left  int64
}

func newFloodReader(d time.Duration, limit int64, rate float64) *floodReader {
	var b []byte
	for i := range 1 << 15 { // 3.2 MB of lines, numbered
		b = append(b, fmt.Sprintf("flood step=%06d%s\n", i, floodLine[len("flood step=000000"):])...)
	}
	now := time.Now()
	return &floodReader{buf: b, start: now, until: now.Add(d), rate: rate, left: limit}
}

func (f *floodReader) Read(p []byte) (int, error) {
	if f.left <= 0 || time.Now().After(f.until) {
		return 0, io.EOF
	}
	if ahead := time.Duration(float64(f.read)/f.rate*float64(time.Second)) - time.Since(f.start); ahead > 0 {
		time.Sleep(ahead)
	}
	p = p[:min(int64(len(p)), f.left, 64<<10)]
	n := 0
	for n < len(p) {
		c := copy(p[n:], f.buf[f.pos:])
		n += c
		f.pos = (f.pos + c) % len(f.buf)
	}
	f.left -= int64(n)
	f.read += int64(n)
	return n, nil
}

// procCPU follows the CPU of the processes whose command line holds every
// one of match, polling /proc, over a window: those already running count
// from the start, those started later from zero, and one that exits counts
// to its last poll.
type procCPU struct {
	match      []string
	mu         sync.Mutex
	base, last map[int]float64
	stop, done chan struct{}
	start, end time.Time
}

func watchProcs(every time.Duration, match ...string) *procCPU {
	p := &procCPU{match: match, base: map[int]float64{}, last: map[int]float64{}, stop: make(chan struct{}), done: make(chan struct{})}
	p.poll(true)
	p.start = time.Now()
	go func() {
		defer close(p.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.poll(false)
			}
		}
	}()
	return p
}

func (p *procCPU) poll(first bool) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p.mu.Lock()
		_, known := p.last[pid]
		p.mu.Unlock()
		if !known {
			b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err != nil || !containsAll(string(b), p.match) {
				continue
			}
		}
		c, err := cpuSeconds(pid)
		if err != nil {
			continue // gone: it keeps its last value
		}
		p.mu.Lock()
		if !known && first {
			p.base[pid] = c
		}
		p.last[pid] = c
		p.mu.Unlock()
	}
}

// cores ends the window: the processes' CPU seconds per wall second.
func (p *procCPU) cores() float64 {
	p.poll(false)
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	var sum float64
	for pid, c := range p.last {
		sum += c - p.base[pid]
	}
	return sum / time.Since(p.start).Seconds()
}

func containsAll(s string, subs []string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// machineBusy is the CPU seconds all processes on the machine have used
// so far: the "cpu" line of /proc/stat less idle, iowait and steal.
func machineBusy() (float64, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, fmt.Errorf("/proc/stat: empty")
	}
	fs := strings.Fields(sc.Text())
	if len(fs) < 6 || fs[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: %q", sc.Text())
	}
	var busy float64
	for i, v := range fs[1:] {
		if i >= 8 { // guest time is already in user
			break
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, err
		}
		if i == 3 || i == 4 || i == 7 { // idle, iowait, steal
			continue
		}
		busy += n
	}
	return busy / clockTicks, nil
}

func (r *floodResult) report(rep *Report, o logsOpts, mode string) {
	for i, c := range r.cases {
		rep.add("command round trip p50, flood vs idle, "+c.Name, c.FloodCmd.P50, "ms", c.IdleCmd.P50, "idle p50")
		row := rep.add("command round trip p99, flood vs idle, "+c.Name, c.FloodCmd.P99, "ms", c.IdleCmd.P99, "idle p99")
		if i == 0 {
			row.goal("p99 ≤ 2× idle", c.FloodCmd.P99 <= 2*c.IdleCmd.P99)
		}
		rep.add("core request/reply p99, flood vs idle, "+c.Name, c.FloodRR.P99, "ms", c.IdleRR.P99, "idle p99")
		rep.add("busy cores, all processes on the machine, flood vs idle, "+c.Name, c.FloodMachineCores, "cores", c.IdleMachineCores, "idle")
		rep.add("  of which this process (NATS, control plane, agent), "+c.Name, c.FloodProcCores, "cores", c.IdleProcCores, "idle")
		if mode == "containerd" {
			rep.add("  of which the Run's log writer process, "+c.Name, c.WriterCores, "cores", 0, "")
		}
		if ct := c.Control; ct != nil {
			rep.add("command round trip p99, same workload to /dev/null vs idle", ct.Cmd.P99, "ms", c.IdleCmd.P99, "idle p99")
			rep.add("core request/reply p99, same workload to /dev/null vs idle", ct.RR.P99, "ms", c.IdleRR.P99, "idle p99")
			rep.add("busy cores, all processes, same workload to /dev/null vs idle", ct.MachineCores, "cores", c.IdleMachineCores, "idle")
			rep.add("  of which its log writer process (reading nothing)", ct.WriterCores, "cores", 0, "")
		}
		mib := func(b int64) float64 { return float64(b) / (1 << 20) }
		rep.add("flood written (kept + dropped), "+c.Name, mib(c.Kept+c.Dropped), "MiB", 0, "")
		rep.add("flood kept and shipped, "+c.Name, mib(c.Kept)/max(c.RunS, 1e-9), "MiB/s", 0, "")
		rep.add("ship lag p99 (writer → stored), "+c.Name, c.Lag.P99, "ms", 0, "")
	}
	rep.Details["flood_cases"] = r.cases
	rep.Details["flood_mode"] = mode
	how := fmt.Sprintf("a busybox container (%d millicores) on a private containerd, the shim running this binary as its log writer; `yes` of a 100-byte line in 16 MiB batches", o.floodCPU)
	if mode == "writer" {
		how = "the no-op runtime, the bench writing the Run's output directory with nodelog.Write (in this process) from an in-memory reader of 100-byte lines at " + strconv.Itoa(o.writerMiBs) + " MiB/s"
	}
	rep.note("flood: %s, for %s (limit off: at most %d MiB); round trips timed from %s after the Run is running until it ends (its output stored)",
		how, o.floodFor, o.floodMiB, o.settle)
	for _, c := range r.cases {
		rep.note("%s: %d idle and %d flood samples over %.1f s; the Run ran %.1f s; kept %.1f MiB, dropped %.1f MiB; max backlog %.1f MiB",
			c.Name, c.IdleCmd.N, c.FloodCmd.N, c.TimedS, c.RunS, float64(c.Kept)/(1<<20), float64(c.Dropped)/(1<<20), float64(c.BehindMax)/(1<<20))
	}
	rep.note("command = PrepareImage (image answered at once by a wrapper, the runtime not asked), one in flight, %s pause before each, interleaved with core request/reply; each waits untimed for its ack", o.pace)
}
