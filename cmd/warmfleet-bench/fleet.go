package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// lapseLimit bounds the wait for a stopped agent to be marked lost.
const lapseLimit = 90 * time.Second

type fleetOpts struct {
	sizes      []int
	warmup     time.Duration
	window     time.Duration
	lapse      int
	images     int
	factsEvery time.Duration
	heartbeat  time.Duration
	noBaseline bool
	// raiseConsumerLimit works around nats-server's default of 1,000
	// consumers per stream, which one durable per node on WF_CMDS hits.
	raiseConsumerLimit bool
}

func newFleetCmd(g *globals) *cobra.Command {
	o := fleetOpts{}
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Control-plane CPU and memory with N simulated agents, and lease-lapse detection",
		Long: `fleet runs three processes: this one holds the embedded NATS server; a child
runs the control plane (so its CPU and memory are its own, read from
/proc/<pid>/stat and /proc/<pid>/status); another child runs N simulated
agents, each a goroutine with its own NATS connection, which enroll on
wf.enroll (open enrollment), heartbeat every second on
wf.node.<id>.heartbeat and publish facts every 30 s on wf.node.<id>.obs.

After enrollment and --warmup, the control plane's CPU is measured over
--window. The baseline is the same fleet against a null control plane (a
process that answers enrollments with a fixed session, decodes every
heartbeat and consumes, decodes and acks every observation): the cost of the
traffic itself. Then --lapse agents stop heartbeating and the bench polls
wf_nodes until each is marked lost; the delay is measured from each one's
last heartbeat and compared with the lease (heartbeat × 5).`,
		RunE: g.reporting(func(ctx context.Context) (*Report, error) { return runFleet(ctx, g, o) }),
	}
	f := cmd.Flags()
	f.IntSliceVar(&o.sizes, "n", []int{500}, "fleet sizes, one measurement each (e.g. 500,2000,5000)")
	f.DurationVar(&o.warmup, "warmup", 3*time.Second, "settling time after the last enrollment")
	f.DurationVar(&o.window, "window", 10*time.Second, "CPU measurement window")
	f.IntVar(&o.lapse, "lapse", 5, "agents that stop heartbeating to time lease-lapse detection (0 skips)")
	f.IntVar(&o.images, "images", 8, "images each simulated node reports in its facts")
	f.DurationVar(&o.factsEvery, "facts-interval", 30*time.Second, "facts interval of simulated nodes")
	f.DurationVar(&o.heartbeat, "heartbeat", time.Second, "heartbeat interval the control plane hands out")
	f.BoolVar(&o.noBaseline, "no-baseline", false, "skip the null-control-plane baseline")
	f.BoolVar(&o.raiseConsumerLimit, "raise-consumer-limit", false, "also set WF_CMDS max_consumers to 1,000,000 from the bench after the control plane provisions it; bus.Provision sets it itself now (nats-server's default is 1,000 consumers per stream, one per node)")
	return cmd
}

// fleetRun is one fleet size against one kind of control plane.
type fleetRun struct {
	Mode           string    `json:"mode"`
	N              int       `json:"n"`
	EnrollSeconds  float64   `json:"enroll_s"`
	CPCores        float64   `json:"cp_cores"`
	NATSCores      float64   `json:"nats_cores"`
	SimCores       float64   `json:"sim_cores"`
	CPRSS          int64     `json:"cp_rss_bytes"`
	CPHeapInuse    float64   `json:"cp_heap_inuse_bytes"`
	CPGoroutines   float64   `json:"cp_goroutines"`
	NATSRSS        int64     `json:"nats_rss_bytes"`
	HeartbeatsSent float64   `json:"heartbeats_sent_per_s"`
	NodeWrites     float64   `json:"wf_nodes_writes_per_s,omitempty"`
	FalseLapses    float64   `json:"false_lease_lapses"`
	SlowConsumer   float64   `json:"slow_consumer_errors"`
	Lapse          Latencies `json:"lapse_from_last_heartbeat,omitzero"`
	LapseN         int       `json:"lapse_detected"`
	// LapseMissed counts stopped agents whose lapse was not detected within
	// the bench's limit (their last heartbeat still queued unprocessed).
	LapseMissed int `json:"lapse_not_detected"`
}

func runFleet(ctx context.Context, g *globals, o fleetOpts) (*Report, error) {
	rep := newReport("fleet")
	var runs []fleetRun
	lease := o.heartbeat * 5
	for _, n := range o.sizes {
		var base *fleetRun
		if !o.noBaseline {
			b, err := fleetOnce(ctx, g, o, n, "null")
			if err != nil {
				return nil, fmt.Errorf("fleet %d, null control plane: %w", n, err)
			}
			base = &b
			runs = append(runs, b)
		}
		r, err := fleetOnce(ctx, g, o, n, "cp")
		if err != nil {
			return nil, fmt.Errorf("fleet %d: %w", n, err)
		}
		runs = append(runs, r)
		var bc, bn, bm float64
		if base != nil {
			bc, bn, bm = base.CPCores, base.NATSCores, base.CPHeapInuse/(1<<20)
		}
		row := rep.add(fmt.Sprintf("N=%d control-plane CPU", n), r.CPCores, "cores", bc, "null control plane")
		if n >= 5000 {
			// Under a core only counts if the control plane keeps up: no live
			// node marked lost, and a stopped one marked lost within the
			// lease plus two scheduling passes.
			keepsUp := r.FalseLapses == 0 && r.LapseMissed == 0 && (r.LapseN == 0 || r.Lapse.Max/1000 <= (lease+2*time.Second).Seconds())
			row.goal("< 1 core at 5000, keeping up", r.CPCores < 1 && keepsUp)
		}
		rep.add(fmt.Sprintf("N=%d NATS server CPU", n), r.NATSCores, "cores", bn, "same, under the null control plane")
		rep.add(fmt.Sprintf("N=%d control-plane heap in use", n), r.CPHeapInuse/(1<<20), "MiB", bm, "null control plane")
		rep.add(fmt.Sprintf("N=%d control-plane RSS", n), float64(r.CPRSS)/(1<<20), "MiB", 0, "")
		rep.add(fmt.Sprintf("N=%d wf_nodes writes", n), r.NodeWrites, "writes/s", r.HeartbeatsSent, "heartbeats sent").unitOfBaseline("/s")
		if r.LapseN > 0 {
			rep.add(fmt.Sprintf("N=%d lease lapse → lost, p50 (from last heartbeat)", n), r.Lapse.P50/1000, "s", lease.Seconds(), "lease length")
			rep.add(fmt.Sprintf("N=%d lease lapse → lost, max", n), r.Lapse.Max/1000, "s", lease.Seconds(), "lease length")
		}
		if r.LapseMissed > 0 {
			rep.note("N=%d: %d of %d stopped agents were not detected as lost within %s: the heartbeat backlog still held their last heartbeat", n, r.LapseMissed, o.lapse, lapseLimit)
		}
		if r.FalseLapses > 0 || r.SlowConsumer > 0 {
			rep.note("N=%d: %v live nodes were marked lost and the control plane's connection reported %v slow-consumer drops", n, r.FalseLapses, r.SlowConsumer)
		}
		rep.add(fmt.Sprintf("N=%d enrollment of the whole fleet", n), r.EnrollSeconds, "s", 0, "")
	}
	rep.Details["runs"] = runs
	rep.note("CPU is /proc/<pid>/stat utime+stime over the window divided by its wall time; heap is runtime.MemStats.HeapInuse after a GC")
	rep.note("heartbeat %s, lease %s, control-plane reconcile every 1 s; facts every %s with %d images each", o.heartbeat, lease, o.factsEvery, o.images)
	return rep, nil
}

func fleetOnce(ctx context.Context, g *globals, o fleetOpts, n int, mode string) (fleetRun, error) {
	res := fleetRun{Mode: mode, N: n}
	e, err := newEnv(g, "fleet")
	if err != nil {
		return res, err
	}
	defer e.close()
	f, err := startFleet(ctx, g, e, o, n, mode)
	if err != nil {
		return res, err
	}
	defer f.stop()
	res.EnrollSeconds = f.enrolled
	select {
	case <-time.After(o.warmup):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	client, err := e.connect("bench-observer")
	if err != nil {
		return res, err
	}
	if err := f.measure(ctx, g, client, o.window, &res); err != nil {
		return res, err
	}
	if mode != "cp" || o.lapse <= 0 {
		return res, nil
	}
	lat, err := measureLapse(ctx, client, f.sim, o.lapse, 5*o.heartbeat, lapseLimit)
	if err != nil {
		return res, err
	}
	res.Lapse, res.LapseN, res.LapseMissed = summarise(lat), len(lat), o.lapse-len(lat)
	return res, nil
}

// fleetProcs are the fleet bench's children: the control plane of mode
// (cp or null) and the simulated agents, all enrolled.
type fleetProcs struct {
	mode     string
	n        int
	cp, sim  *child
	enrolled float64 // seconds the whole fleet took to enroll
	cleanup  undo
}

func startFleet(ctx context.Context, g *globals, e *env, o fleetOpts, n int, mode string) (*fleetProcs, error) {
	f := &fleetProcs{mode: mode, n: n}
	cp, err := startChild("cp-serve", "cp-serve", "--nats-url", e.url, "--mode", mode, "--heartbeat", o.heartbeat.String(),
		"--log-level", g.cpLogLevel, "--log-file", filepath.Join(e.dir, "cp.log"))
	if err != nil {
		return nil, err
	}
	f.cp = cp
	f.cleanup.push(func() { cp.stop(30 * time.Second) })
	if _, err := cp.await("ready", 60*time.Second); err != nil {
		f.stop()
		return nil, err
	}
	if o.raiseConsumerLimit {
		if err := raiseConsumerLimit(ctx, e); err != nil {
			f.stop()
			return nil, err
		}
	}
	sim, err := startChild("fleet-sim", "fleet-sim", "--nats-url", e.url, "--n", strconv.Itoa(n), "--images", strconv.Itoa(o.images),
		"--facts-interval", o.factsEvery.String())
	if err != nil {
		f.stop()
		return nil, err
	}
	f.sim = sim
	f.cleanup.push(func() { sim.stop(30 * time.Second) })
	m, err := sim.await("enrolled", time.Duration(n)*50*time.Millisecond+60*time.Second)
	if err != nil {
		f.stop()
		return nil, err
	}
	f.enrolled, _ = m["seconds"].(float64)
	return f, nil
}

func (f *fleetProcs) stop() { f.cleanup.run() }

// measure takes the control plane's, NATS's and the simulator's CPU over
// window (the control plane profiled with --cpuprofile), the wf_nodes
// writes and heartbeats over it, and the control plane's memory after.
func (f *fleetProcs) measure(ctx context.Context, g *globals, client *bus.Conn, window time.Duration, res *fleetRun) error {
	simBefore, err := stats(f.sim)
	if err != nil {
		return err
	}
	kvSeq0 := streamLastSeq(ctx, client.JS, "KV_"+bus.BucketNodes)
	prof := g.cpuProfile != ""
	if prof {
		if err := f.cp.send("prof-start " + profPath(g.cpuProfile, f.mode, f.n)); err != nil {
			return err
		}
		if _, err := f.cp.await("prof-started", 10*time.Second); err != nil {
			return err
		}
	}
	cpM, err := startMeter(f.cp.pid())
	if err != nil {
		return err
	}
	natsM, _ := startMeter(os.Getpid())
	simM, _ := startMeter(f.sim.pid())
	t0 := time.Now()
	select {
	case <-time.After(window):
	case <-ctx.Done():
		return ctx.Err()
	}
	res.CPCores, _ = cpM.cores()
	res.NATSCores, _ = natsM.cores()
	res.SimCores, _ = simM.cores()
	wall := time.Since(t0).Seconds()
	if prof {
		_ = f.cp.send("prof-stop")
		_, _ = f.cp.await("prof-stopped", 10*time.Second)
	}
	res.NodeWrites = float64(streamLastSeq(ctx, client.JS, "KV_"+bus.BucketNodes)-kvSeq0) / wall
	return f.collect(simBefore, wall, res)
}

// collect reads both children's stats after the window.
func (f *fleetProcs) collect(simBefore map[string]any, wall float64, res *fleetRun) error {
	after, err := stats(f.cp)
	if err != nil {
		return err
	}
	simAfter, err := stats(f.sim)
	if err != nil {
		return err
	}
	res.HeartbeatsSent = (simAfter["heartbeats_sent"].(float64) - simBefore["heartbeats_sent"].(float64)) / wall
	res.CPRSS = rssBytes(f.cp.pid())
	res.NATSRSS = rssBytes(os.Getpid())
	res.CPHeapInuse, _ = after["heap_inuse"].(float64)
	res.CPGoroutines, _ = after["goroutines"].(float64)
	res.SlowConsumer, _ = after["slow_consumer_errors"].(float64)
	if f.mode == "cp" {
		res.FalseLapses = lapses(after)
	}
	return nil
}

func profPath(base, mode string, n int) string {
	ext := filepath.Ext(base)
	return fmt.Sprintf("%s.%s-%d%s", base[:len(base)-len(ext)], mode, n, ext)
}

// stats asks a child (cp-serve or fleet-sim) for its stats line.
func stats(c *child) (map[string]any, error) {
	if err := c.send("stats"); err != nil {
		return nil, err
	}
	return c.await("stats", 30*time.Second)
}

// lapses is the control plane's lease-lapse counter from a stats line.
func lapses(st map[string]any) float64 {
	m, _ := st["metrics"].(map[string]any)
	v, _ := m["LeaseLapses"].(float64)
	return v
}

func streamLastSeq(ctx context.Context, js jetstream.JetStream, stream string) uint64 {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.LastSeq
}

// measureLapse stops k agents' heartbeats and times, from each one's last
// heartbeat, until wf_nodes records it lost.
func measureLapse(ctx context.Context, client *bus.Conn, sim *child, k int, lease, within time.Duration) ([]time.Duration, error) {
	kv, err := client.JS.KeyValue(ctx, bus.BucketNodes)
	if err != nil {
		return nil, err
	}
	if err := sim.send("stop " + strconv.Itoa(k)); err != nil {
		return nil, err
	}
	m, err := sim.await("stopped", 10*time.Second)
	if err != nil {
		return nil, err
	}
	nodes, _ := m["nodes"].([]any)
	last := map[string]time.Time{}
	for _, x := range nodes {
		nm, _ := x.(map[string]any)
		id, _ := nm["id"].(string)
		ns, _ := nm["last_heartbeat_unix_nano"].(float64)
		last[id] = time.Unix(0, int64(ns))
	}
	// A node counts as detected when wf_nodes says lost and its lease is
	// the one its final heartbeat set (lease_expires ≥ last heartbeat +
	// lease): a backlog of unprocessed heartbeats can mark a live node lost
	// early and then revive it, and that is not detection.
	var out []time.Duration
	deadline := time.Now().Add(within)
	for len(last) > 0 {
		for id, hb := range last {
			var rec schemas.NodeRecord
			if _, err := bus.GetJSON(ctx, kv, id, &rec); err == nil && rec.State == schemas.NodeLost && !rec.LeaseExpires.Before(hb.Add(lease)) {
				out = append(out, time.Since(hb))
				delete(last, id)
			}
		}
		if time.Now().After(deadline) {
			return out, nil // the rest went undetected; the caller reports how many
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
	return out, nil
}

// raiseConsumerLimit gives WF_CMDS an explicit max_consumers. An unlimited
// (-1, the default) stream limit does not opt out of the server's default of
// 1,000 consumers per stream; only a positive one does.
func raiseConsumerLimit(ctx context.Context, e *env) error {
	c, err := e.connect("bench-admin")
	if err != nil {
		return err
	}
	s, err := c.JS.Stream(ctx, bus.StreamCmds)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	cfg := info.Config
	cfg.MaxConsumers = 1_000_000
	if _, err := c.JS.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("raise %s max_consumers: %w", bus.StreamCmds, err)
	}
	return nil
}
