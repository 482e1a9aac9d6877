package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/agent/artifactstore"
	"github.com/warmfleet/warmfleet/agent/caches"
	"github.com/warmfleet/warmfleet/agent/creds"
	"github.com/warmfleet/warmfleet/agent/disk"
	"github.com/warmfleet/warmfleet/agent/output"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Agent is one node's agent. Run drives it.
type Agent struct {
	cfg     Config
	conn    *bus.Conn
	rt      noderuntime.Runtime
	log     *zap.Logger
	journal *Journal
	meter   *meter
	// factsChanged wakes the facts loop; rt (a changeWatch) signals it.
	factsChanged chan struct{}
	// launches counts rt's launches in flight: facts wait for them.
	launches *launchGate

	req       requester
	rep       *reporter
	creds     *creds.Asker
	attempts  *attempts
	caches    caches.Store
	replicas  *replicas
	disk      *disk.Collector
	output    *output.Shipper
	workloads *workloads

	mu sync.Mutex // guards the three below
	// enr is the current session.
	enr schemas.Enrollment
	// cancel stops Run; stopErr is what Run then returns.
	cancel  context.CancelFunc
	stopErr error

	wg sync.WaitGroup // every goroutine the agent starts
}

// New returns an agent; it opens the journal but talks to nobody yet.
func New(cfg Config, conn *bus.Conn, rt noderuntime.Runtime, log *zap.Logger) (*Agent, error) {
	if err := schemas.ValidateID("node_id", cfg.NodeID, schemas.CodeMalformed); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if cfg.DataDir == "" {
		return nil, errors.New("agent: a data dir is required for the operation journal")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	j, err := OpenJournal(cfg.DataDir, 0)
	if err != nil {
		return nil, err
	}
	log = log.With(zap.String("node_id", cfg.NodeID))
	store, err := artifactstore.New(cfg.ArtifactDir)
	if err != nil {
		return nil, fmt.Errorf("agent: artifact store: %w", err)
	}
	var (
		nc *nats.Conn
		js jetstream.JetStream
	)
	if conn != nil {
		nc, js = conn.NC, conn.JS
	}
	changed, launches := make(chan struct{}, 1), newLaunchGate()
	watch := changeWatch{Runtime: rt, changed: changed, launches: launches}
	signal := watch.signal
	a := &Agent{cfg: cfg, conn: conn, rt: watch, log: log, journal: j,
		factsChanged: changed, launches: launches, req: requester{nc: nc}, attempts: newAttempts(), caches: caches.New(cfg.CacheDir, cfg.Now, log)}
	a.meter = &meter{rt: a.rt, accel: &boundedProbe{probe: cfg.Accelerator, timeout: cfg.AcceleratorTimeout, log: log}, caches: a.caches,
		replicas: store, contentRoot: cfg.ContentRoot, networkModes: cfg.NetworkModes, maxWorkloads: cfg.MaxWorkloads,
		watermarks: cfg.DiskWatermarks, now: cfg.Now, log: log}
	a.rep = &reporter{js: js, nodeID: cfg.NodeID, session: a.Enrollment, now: cfg.Now, log: log}
	a.creds = &creds.Asker{NodeID: cfg.NodeID, Requester: a.req, FencingToken: a.fencingToken, Metrics: cfg.ImageMetrics, Log: log}
	a.replicas = &replicas{store: store, creds: a.creds, js: js, nc: nc, transport: cfg.ArtifactTransport, authOn: cfg.Credentials != nil,
		http: cfg.ArtifactHTTP, nodeID: cfg.NodeID, changed: signal, log: log}
	a.disk = disk.New(disk.Config{NodeID: cfg.NodeID, ContentRoot: cfg.ContentRoot, CacheDir: cfg.CacheDir, ArtifactDir: cfg.ArtifactDir,
		Watermarks: cfg.DiskWatermarks, Runtime: a.rt, Busy: a.attempts, Caches: a.caches, Artifacts: store,
		Metrics: cfg.DiskMetrics, Removed: signal, Log: log})
	a.output = output.New(output.Config{DataDir: cfg.DataDir, NodeID: cfg.NodeID, JS: js, Dialer: cfg.LogDialer, Poll: cfg.LogPoll, RefusedWait: cfg.LogRefusedWait,
		Now: cfg.Now, Metrics: cfg.LogMetrics, Log: log, Group: &a.wg})
	a.workloads = &workloads{rt: a.rt, journal: j, output: a.output, attempts: a.attempts, rep: a.rep, log: log,
		now: cfg.Now, stopGrace: cfg.StopGrace, shipTimeout: cfg.LogShipTimeout,
		wg: &a.wg, watching: map[string]context.CancelFunc{}}
	return a, nil
}

// Enrollment returns the current session (zero before enrolling).
func (a *Agent) Enrollment() schemas.Enrollment {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.enr
}

// fencingToken is the current session's.
func (a *Agent) fencingToken() uint64 { return a.Enrollment().FencingToken }

// Run enrolls, reconciles what the runtime already holds, and serves
// commands and heartbeats until ctx ends. Workloads keep running when the
// agent stops; the next agent process picks them up.
func (a *Agent) Run(ctx context.Context) error {
	defer a.journal.Close()
	defer a.wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.mu.Lock()
	a.cancel = cancel
	a.mu.Unlock()

	facts := a.meter.facts(ctx)
	enr, err := a.enroll(ctx, facts)
	if err != nil {
		return err
	}
	cons, err := a.conn.JS.Consumer(ctx, bus.StreamCmds, enr.Consumer)
	if err != nil {
		return fmt.Errorf("agent: bind command consumer %s: %w", enr.Consumer, err)
	}
	if err := a.workloads.reconcile(ctx, facts); err != nil {
		a.log.Warn("reconcile after start", zap.Error(err))
	}
	// A callback may still be running when Stop returns; the gate waits for
	// it and turns later ones away, so no command starts work (a drain
	// goroutine, a runtime call) after Run has waited for its goroutines.
	var gate sync.RWMutex
	stopped := false
	// The commands of one attempt are applied in arrival order, each
	// attempt's on a goroutine of its own, so a slow image pull for one Run
	// never holds up a stop for another. Nothing bounds the queues here:
	// the command consumer's MaxAckPending does, since a command stays
	// unacked until it is applied.
	queues := keyed.NewPool(ctx, &a.wg, keyed.PoolOptions{}, func(ctx context.Context, q queuedCmd) { a.handle(ctx, q.m, q.c) })
	cc, err := cons.Consume(func(m jetstream.Msg) {
		gate.RLock()
		defer gate.RUnlock()
		if !stopped {
			a.enqueue(queues, m)
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		a.log.Debug("command consumer", zap.Error(err))
	}))
	if err != nil {
		return fmt.Errorf("agent: consume commands: %w", err)
	}
	defer func() {
		cancel() // stops the attempt queues and any command in hand
		cc.Stop()
		gate.Lock()
		stopped = true
		gate.Unlock()
	}()
	stopPrune, err := a.servePrune(ctx)
	if err != nil {
		return err
	}
	defer stopPrune()
	a.log.Info("agent serving", zap.Uint64("fencing_token", enr.FencingToken), zap.Bool("resumed", enr.Duplicate))
	a.wg.Go(func() { a.renewLoop(ctx, a.supersede) })
	a.wg.Go(func() { a.factsLoop(ctx, a.cfg.FactsInterval) })
	a.wg.Go(func() { a.serveSessions(ctx) })
	a.heartbeat(ctx, time.Duration(enr.HeartbeatSeconds)*time.Second)
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stopErr
}

// supersede stops the agent for good: a newer session of this node exists.
func (a *Agent) supersede(err error) {
	a.mu.Lock()
	if a.stopErr == nil {
		a.stopErr = err
		a.log.Warn("stopping: this session was superseded", zap.Error(err))
	}
	cancel := a.cancel
	a.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// checkInterruption looks for the provider's notice once, within a
// heartbeat's interval.
func (a *Agent) checkInterruption(ctx context.Context, within time.Duration) *schemas.InterruptionNotice {
	cctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	n, err := a.cfg.Interruption.Check(cctx)
	if err != nil {
		a.log.Debug("interruption notice: look failed", zap.Error(err))
		return nil
	}
	if n != nil {
		a.log.Warn("the provider is taking this machine back", zap.String("source", n.Source), zap.Time("at", n.At))
	}
	return n
}

// heartbeat publishes liveness until ctx ends, with the provider's
// interruption notice once one is seen.
func (a *Agent) heartbeat(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = 2 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var notice *schemas.InterruptionNotice
	for {
		if notice == nil && a.cfg.Interruption != nil {
			notice = a.checkInterruption(ctx, every/2)
		}
		enr := a.Enrollment()
		hb := schemas.Heartbeat{NodeID: a.cfg.NodeID, FencingToken: enr.FencingToken, SentAt: a.cfg.Now(), Running: a.workloads.running(), Interruption: notice}
		if b, err := codec.Encode(codec.MsgPack, hb); err == nil {
			_ = a.conn.NC.Publish(bus.NodeHeartbeat(a.cfg.NodeID), b)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
