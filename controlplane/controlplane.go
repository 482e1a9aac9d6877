package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/internal/keyed"
)

// Config tunes the control plane. Zero values take the defaults.
type Config struct {
	// HeartbeatInterval is what nodes are told to heartbeat at; a node's
	// lease is LeaseMultiplier heartbeats long.
	HeartbeatInterval time.Duration
	LeaseMultiplier   int
	// SessionTTL is how long an enrollment's session token is good for.
	SessionTTL time.Duration
	// ReconcileInterval is how often stuck Runs and lapsed leases are swept.
	ReconcileInterval time.Duration
	// RedispatchAfter is how long a Run may sit in placed/preparing/launching
	// without progress before its commands are sent again (same operation
	// ids, so a node applies them once).
	RedispatchAfter time.Duration
	// MaxAttempts is how many nodes a Run may be lost on before it fails.
	MaxAttempts int
	// MaxRuntimeSlack is how long past its max runtime a Run may report
	// running before the control plane itself sends a stop; the node enforces
	// the limit first.
	MaxRuntimeSlack time.Duration
	// CommandAckWait is how long a node's command waits for an ack before
	// JetStream redelivers it (to the agent's next process after a crash).
	CommandAckWait time.Duration
	// Placement weighs time against price; zero fields take defaults.
	Placement placement.Config
	// DecisionCandidates bounds the full candidate entries a stored
	// decision keeps (schemas.BookingDecision.Compact); the other nodes
	// are named by reason only. DefaultDecisionCandidates when zero.
	DecisionCandidates int
	// WaitForCapacity keeps a Run that no enrolled node could ever run
	// waiting (for a node to join) instead of failing it at once.
	WaitForCapacity bool
	// Capacity, when set, rents machines for Runs no node fits.
	Capacity *CapacityConfig
	// OpenEnrollment admits nodes that present no enrollment token. For
	// local development only: anyone who can publish wf.enroll joins.
	OpenEnrollment bool
	Topology       bus.Topology
	// Sessions tunes session residency (session.go).
	Sessions SessionConfig
	// Now is the control plane's clock; tests may replace it.
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 2 * time.Second
	}
	if c.LeaseMultiplier <= 0 {
		c.LeaseMultiplier = 5
	}
	if c.SessionTTL <= 0 {
		c.SessionTTL = time.Hour
	}
	if c.DecisionCandidates <= 0 {
		c.DecisionCandidates = DefaultDecisionCandidates
	}
	if c.ReconcileInterval <= 0 {
		c.ReconcileInterval = time.Second
	}
	if c.RedispatchAfter <= 0 {
		c.RedispatchAfter = 30 * time.Second
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 3
	}
	if c.MaxRuntimeSlack <= 0 {
		c.MaxRuntimeSlack = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Capacity != nil {
		c.Capacity.defaults()
	}
	def := placement.DefaultConfig()
	p := &c.Placement
	if p.PullBytesPerSecond <= 0 {
		p.PullBytesPerSecond = def.PullBytesPerSecond
	}
	if p.CacheBytesPerSecond <= 0 {
		p.CacheBytesPerSecond = def.CacheBytesPerSecond
	}
	if p.UnknownImageBytes <= 0 {
		p.UnknownImageBytes = def.UnknownImageBytes
	}
	if p.UnknownRuntime <= 0 {
		p.UnknownRuntime = def.UnknownRuntime
	}
	if p.SecondsPerDollarHour <= 0 {
		p.SecondsPerDollarHour = def.SecondsPerDollarHour
	}
	if p.FactsMaxAge <= 0 {
		p.FactsMaxAge = def.FactsMaxAge
	}
}

// ControlPlane is one replica of the control plane.
type ControlPlane struct {
	cfg      Config
	conn     *bus.Conn
	log      *zap.Logger
	runsKV   jetstream.KeyValue
	nodesKV  jetstream.KeyValue
	enrollKV jetstream.KeyValue
	// rentalsKV is wf_rentals; used only when Capacity is configured.
	rentalsKV jetstream.KeyValue
	cache     *cache
	metrics   metrics

	// ready closes once Run serves every subject.
	ready chan struct{}
	// fleetView is the fleet decideAtIntake decides on; fleetViewMu lets
	// one intake worker at a time take a new one.
	fleetView   atomic.Pointer[intakeView]
	fleetViewMu sync.Mutex
	// kick asks the scheduler to look at accepted Runs now.
	kick chan struct{}
	// enrollLocks orders enrollments of one node in this replica; different
	// nodes enroll concurrently. Across replicas the node record's CAS
	// decides.
	enrollLocks keyed.Mutex
	// outbox tracks Run events still to be published after a failed
	// publish, and the crash repair of the first reconcile pass.
	outbox outboxRepair
	// sessions serves session residency (session.go); set by Run.
	sessions *sessions
	// rentalLeader is the rental loop's election (rentalleader.go); set by
	// the rental loop, nil until then and without Capacity.
	rentalLeader atomic.Pointer[leaderLease]
}

type metrics struct {
	transitions   atomic.Int64
	fencedObs     atomic.Int64
	rejected      atomic.Int64
	staleReports  atomic.Int64
	leaseLapses   atomic.Int64
	commandsSent  atomic.Int64
	placementMiss atomic.Int64
	decisions     atomic.Int64
	decisionNanos atomic.Int64
	passes        atomic.Int64
	intakeDecided atomic.Int64
	heartbeats    atomic.Int64
	eventsSent    atomic.Int64
}

// Metrics is a snapshot of the control plane's counters.
type Metrics struct {
	Transitions, FencedObservations, Rejected, StaleReports, LeaseLapses, CommandsSent, PlacementMisses int64
	Decisions, DecisionNanos                                                                            int64
	// Passes counts scheduling passes; a pass decides only the waiting Runs
	// whose fleet changed (decisionMemo).
	Passes int64
	// DecidedAtIntake counts Runs stored with their first decision
	// (decideAtIntake), which the scheduler then had no write to make for.
	DecidedAtIntake int64
	// Heartbeats counts heartbeats that extended a lease; EventsPublished
	// counts Run event publishes (including repairs that dedupe dropped).
	Heartbeats, EventsPublished int64
}

// Metrics returns the current counters.
func (cp *ControlPlane) Metrics() Metrics {
	m := &cp.metrics
	return Metrics{
		Transitions: m.transitions.Load(), FencedObservations: m.fencedObs.Load(), Rejected: m.rejected.Load(),
		StaleReports: m.staleReports.Load(), LeaseLapses: m.leaseLapses.Load(), CommandsSent: m.commandsSent.Load(),
		PlacementMisses: m.placementMiss.Load(), Decisions: m.decisions.Load(), DecisionNanos: m.decisionNanos.Load(),
		Heartbeats: m.heartbeats.Load(), EventsPublished: m.eventsSent.Load(), Passes: m.passes.Load(), DecidedAtIntake: m.intakeDecided.Load(),
	}
}

// DefaultDecisionCandidates keeps a decision over any fleet to about 100 KB
// (a full decision over 10,000 nodes is about 2 MB, past NATS's 1 MB
// message limit, so the Run could not be written).
const DefaultDecisionCandidates = 64

// New provisions the streams and buckets (idempotently) and returns a
// control plane ready to Run.
func New(ctx context.Context, conn *bus.Conn, cfg Config, log *zap.Logger) (*ControlPlane, error) {
	cfg.defaults()
	if err := bus.Provision(ctx, conn.JS, cfg.Topology); err != nil {
		return nil, err
	}
	runsKV, err := conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		return nil, fmt.Errorf("controlplane: open %s: %w", bus.BucketRuns, err)
	}
	nodesKV, err := conn.JS.KeyValue(ctx, bus.BucketNodes)
	if err != nil {
		return nil, fmt.Errorf("controlplane: open %s: %w", bus.BucketNodes, err)
	}
	enrollKV, err := conn.JS.KeyValue(ctx, bus.BucketEnroll)
	if err != nil {
		return nil, fmt.Errorf("controlplane: open %s: %w", bus.BucketEnroll, err)
	}
	rentalsKV, err := conn.JS.KeyValue(ctx, bus.BucketRentals)
	if err != nil {
		return nil, fmt.Errorf("controlplane: open %s: %w", bus.BucketRentals, err)
	}
	if cfg.Capacity != nil && (cfg.Capacity.Provider == nil || cfg.Capacity.OwnershipToken == "") {
		return nil, errors.New("controlplane: Capacity needs a Provider and an OwnershipToken")
	}
	return &ControlPlane{
		cfg: cfg, conn: conn, log: log, runsKV: runsKV, nodesKV: nodesKV, enrollKV: enrollKV, rentalsKV: rentalsKV,
		cache: newCache(), kick: make(chan struct{}, 1), ready: make(chan struct{}),
	}, nil
}

// Ready is closed once Run answers on every subject.
func (cp *ControlPlane) Ready() <-chan struct{} { return cp.ready }

func (cp *ControlPlane) now() time.Time { return cp.cfg.Now() }

func (cp *ControlPlane) leaseTTL() time.Duration {
	return cp.cfg.HeartbeatInterval * time.Duration(cp.cfg.LeaseMultiplier)
}

// Run serves until ctx ends: KV watches, intake, observation ingest,
// enrollment and heartbeats, and the reconcile loop. It returns the first
// error that stops a part, or nil after ctx ends.
func (cp *ControlPlane) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait() // runs last: after cancel below
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := cp.cache.start(ctx, &wg, cp.runsKV, cp.nodesKV, cp.log); err != nil {
		return err
	}
	// This replica has heard no heartbeat yet: give every node one lease
	// to be heard before the sweep may call it lost.
	cp.cache.graceLeases(cp.now().Add(cp.leaseTTL()))
	// Every active Run's last events are checked against WF_EVENTS on the
	// first pass, in case a replica stopped between a write and its publish.
	cp.outbox.repairAllOnNextPass()
	stopSubs, err := cp.serveNodes(ctx, &wg)
	if err != nil {
		return err
	}
	defer stopSubs()
	stopSessions, err := cp.serveSessions(ctx)
	if err != nil {
		return err
	}
	defer stopSessions()

	intakePool := keyed.NewPool(ctx, &wg, keyed.PoolOptions{Workers: IntakeWorkers, Queue: IntakeWorkers * 8}, cp.handleIntake)
	intake, err := cp.consume(ctx, bus.StreamRuns, bus.IntakeConsumerConfig(), func(ctx context.Context, m jetstream.Msg) {
		job := cp.parseIntake(ctx, m)
		intakePool.Submit(job.key, job) // false only when ctx ended: m stays unacked and is redelivered
	})
	if err != nil {
		return err
	}
	defer intake.Stop()
	// Observations are handled by node: one node's reports (receipts,
	// workload phases, facts) keep their order, different nodes' run
	// concurrently.
	obsPool := keyed.NewPool(ctx, &wg, keyed.PoolOptions{Workers: ObsWorkers, Queue: ObsWorkers * 8}, func(ctx context.Context, job obsJob) {
		if job.redelivered {
			ctx = markRepair(ctx)
		}
		cp.handleObservation(ctx, job.m)
	})
	obs, err := cp.consume(ctx, bus.StreamObs, bus.ObsConsumerConfig(), func(ctx context.Context, m jetstream.Msg) {
		obsPool.Submit(subjectNode(m.Subject()), obsJob{m: m, redelivered: repairing(ctx)})
	})
	if err != nil {
		return err
	}
	defer obs.Stop()

	cp.askReconcile(ctx)
	wg.Go(func() { cp.reconcileLoop(ctx) })
	if cp.cfg.Capacity != nil {
		wg.Go(func() { cp.rentalLoop(ctx) })
	}
	close(cp.ready)
	cp.log.Info("control plane serving", zap.String("nats", cp.conn.NC.ConnectedUrlRedacted()))
	<-ctx.Done()
	return nil
}

// ObsWorkers is how many nodes' observations one replica handles at once.
const ObsWorkers = 16

// obsJob is one WF_OBS message on its way to an observation worker.
type obsJob struct {
	m           jetstream.Msg
	redelivered bool
}

// IntakeWorkers is how many intake messages one replica handles at once.
// It stays well below the intake consumer's MaxAckPending (1,024), so the
// workers' queues, not the server, hold the backlog.
const IntakeWorkers = 64

// consume binds a durable consumer and hands each message to h on the
// consumer's callback goroutine, in stream order. h gets a context marked
// for outbox repair when the message is a redelivery (see repairing).
func (cp *ControlPlane) consume(ctx context.Context, stream string, cfg jetstream.ConsumerConfig, h func(context.Context, jetstream.Msg)) (jetstream.ConsumeContext, error) {
	c, err := cp.conn.JS.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("controlplane: consumer %s on %s: %w", cfg.Durable, stream, err)
	}
	cc, err := c.Consume(func(m jetstream.Msg) { h(withRedelivery(ctx, m), m) },
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, context.Canceled) {
				cp.log.Debug("consumer error", zap.String("consumer", cfg.Durable), zap.Error(err))
			}
		}))
	if err != nil {
		return nil, fmt.Errorf("controlplane: consume %s: %w", cfg.Durable, err)
	}
	return cc, nil
}

// poke wakes the scheduler without blocking.
func (cp *ControlPlane) poke() {
	select {
	case cp.kick <- struct{}{}:
	default:
	}
}
