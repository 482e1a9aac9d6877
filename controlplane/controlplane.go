package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/admission"
	"github.com/warmfleet/warmfleet/controlplane/artifactauth"
	"github.com/warmfleet/warmfleet/controlplane/artifacts"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/ingest"
	"github.com/warmfleet/warmfleet/controlplane/intake"
	"github.com/warmfleet/warmfleet/controlplane/lane"
	"github.com/warmfleet/warmfleet/controlplane/nodes"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/controlplane/prefetch"
	"github.com/warmfleet/warmfleet/controlplane/registryauth"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/controlplane/scheduler"
	"github.com/warmfleet/warmfleet/controlplane/secretauth"
	"github.com/warmfleet/warmfleet/controlplane/secrets"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/controlplane/tenantread"
	"github.com/warmfleet/warmfleet/controlplane/usage"
	"github.com/warmfleet/warmfleet/internal/keyed"
)

// ControlPlane is one replica of the control plane: the parts below, wired
// to their consumers and subscriptions.
type ControlPlane struct {
	cfg   Config
	conn  *bus.Conn
	log   *zap.Logger
	cache *cache.Cache
	// The buckets the cache mirrors.
	runsKV, nodesKV, residencyKV jetstream.KeyValue

	runs *runs.Store
	// policy is the scheduling policy: Config.SchedulingPolicyFile read
	// again when it changes, or the empty policy without one.
	policy    policy.Source
	retention *runs.Retention
	dispatch  *dispatch.Dispatcher
	scheduler *scheduler.Scheduler
	intake    *intake.Intake
	ingest    *ingest.Ingest
	nodes     *nodes.Service
	sessions  *sessions.Service
	prefetch  *prefetch.Service
	rentals   *rentals.Manager // nil without Capacity
	lane      *lane.Manager    // nil without Lane
	// registryAuth gives nodes registry credentials at pull time.
	registryAuth *registryauth.Service
	// artifacts is the artifact catalog, resolved at intake; its service
	// answers operators' register and remove.
	artifacts        *artifacts.Catalog
	artifactsService *artifacts.Service
	// artifactAuth gives nodes artifact source credentials per fetch.
	artifactAuth *artifactauth.Service
	// tenantRead answers producers' reads of their own tenant's Runs,
	// events and output.
	tenantRead *tenantread.Service
	// secrets is the sealed secret store and its services; nil without
	// Config.SecretsKeyFile.
	secrets        *secrets.Store
	secretsService *secrets.Service
	// secretAuth hands booked attempts their secrets; nil without
	// Config.SecretsKeyFile.
	secretAuth *secretauth.Service
	// callout is the NATS auth callout; nil without Config.Auth.
	callout *admission.Callout

	// usage sums WF_USAGE and answers the budgets of the scheduler and
	// the rental policy.
	usage *usage.Ledger

	// ready closes once Run serves every subject.
	ready chan struct{}
}

// New provisions the streams and buckets (idempotently) and returns a
// control plane ready to Run.
func New(ctx context.Context, conn *bus.Conn, cfg Config, log *zap.Logger) (*ControlPlane, error) {
	cfg.defaults()
	if err := cfg.check(); err != nil {
		return nil, err
	}
	pol, err := loadPolicy(cfg.SchedulingPolicyFile, log)
	if err != nil {
		return nil, err
	}
	if err := bus.Provision(ctx, conn.JS, cfg.Topology); err != nil {
		return nil, err
	}
	kv := map[string]jetstream.KeyValue{}
	for _, b := range []string{bus.BucketRuns, bus.BucketNodes, bus.BucketEnroll, bus.BucketRentals, bus.BucketResidency, bus.BucketPrefetch, bus.BucketArtifactGrants} {
		h, err := conn.JS.KeyValue(ctx, b)
		if err != nil {
			return nil, fmt.Errorf("controlplane: open %s: %w", b, err)
		}
		kv[b] = h
	}
	cp := &ControlPlane{cfg: cfg, conn: conn, log: log, cache: cache.New(), policy: pol,
		runsKV: kv[bus.BucketRuns], nodesKV: kv[bus.BucketNodes], residencyKV: kv[bus.BucketResidency], ready: make(chan struct{})}
	// The scheduler is made last but poked by the parts made before it.
	poke := func() { cp.scheduler.Poke() }
	cp.runs = runs.NewStore(cp.runsKV, conn.JS, cp.cache, runs.Config{DecisionCandidates: cfg.DecisionCandidates, MaxAttempts: cfg.MaxAttempts, Poke: poke, Now: cfg.Now}, log)
	cp.retention, err = runs.NewRetention(cp.runs, runs.RetentionConfig{Keep: cfg.RunRetention, Interval: cfg.RetentionInterval,
		MarkerTTL: cfg.Topology.RunsMarkerTTL()})
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	cp.dispatch = dispatch.New(conn.JS, cp.cache, cfg.Now, log)
	if len(cfg.Sessions.Tenants) == 0 {
		cfg.Sessions.Tenants = cfg.Tenants
	}
	cp.sessions = sessions.New(cfg.Sessions, conn, cp.cache, cp.nodesKV, func(now time.Time) *placement.Fleet { return cp.scheduler.Fleet(now) }, cfg.Now, log)
	cp.nodes = nodes.New(nodes.Config{
		HeartbeatInterval: cfg.HeartbeatInterval, LeaseMultiplier: cfg.LeaseMultiplier, SessionTTL: cfg.SessionTTL,
		CommandAckWait: cfg.CommandAckWait, OpenEnrollment: cfg.OpenEnrollment, RentedPrices: cfg.Capacity != nil, Now: cfg.Now,
		ControlPlaneCA: cfg.ControlPlaneCA,
	}, conn, cp.nodesKV, kv[bus.BucketEnroll], kv[bus.BucketRentals], cp.cache, cp.runs, cp.sessions, poke, log)
	cp.usage = usage.NewLedger(conn.JS, cp.policy, cp.cache, cfg.Now, log.Named("usage"))
	renter, laneStep, err := cp.capacity(kv[bus.BucketRentals])
	if err != nil {
		return nil, err
	}
	cp.scheduler = scheduler.New(scheduler.Config{
		Interval: cfg.ReconcileInterval, Timing: cfg.timing(),
		Placement: cfg.Placement, WaitForCapacity: cfg.WaitForCapacity, Now: cfg.Now, Lane: laneStep,
		Policy: cp.policy, Budgets: cp.usage,
	}, cp.cache, cp.runs, cp.dispatch, cp.nodes, renter, log)
	cat, err := artifacts.Open(ctx, conn.JS, cfg.Now, log.Named("artifacts"))
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	cp.artifacts, cp.artifactsService = cat, artifacts.NewService(cat, conn.NC, log.Named("artifacts"), cfg.Tenants...)
	if err := cp.openSecrets(ctx); err != nil {
		return nil, err
	}
	cp.intake = intake.New(cp.runs, cp.scheduler, cp.dispatch, cp.artifacts, cp.secretChecker(), cp.policy, cfg.Now, log)
	cp.prefetch = prefetch.New(kv[bus.BucketPrefetch], conn.NC, cp.cache, cp.dispatch, cfg.PrefetchFlushInterval, cfg.Now, log.Named("prefetch"),
		prefetch.WithArtifacts(cp.artifacts), prefetch.WithTenants(cfg.Tenants))
	cp.ingest = ingest.New(cp.cache, cp.nodesKV, cp.runs, cp.dispatch, cp.nodes, cp.prefetch, cfg.Now, log)
	// A node's disk collection keeps what booked Runs need and what an
	// open prefetch wants there.
	cp.nodes.AddDiskKeeper(cp.prefetch)
	cp.credentialServices(kv[bus.BucketArtifactGrants])
	cp.tenantRead = tenantread.New(conn, cp.runsKV, cfg.Tenants, log.Named("tenantread"))
	if cfg.Auth != nil {
		if cp.callout, err = admission.New(ctx, conn, *cfg.Auth, log); err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
	}
	return cp, nil
}

// capacity makes what places Runs beyond the enrolled nodes: the rental
// manager (with Capacity) and the ephemeral lane (with Lane); each is nil
// without its config.
func (cp *ControlPlane) capacity(rentalsKV jetstream.KeyValue) (scheduler.Renter, scheduler.Lane, error) {
	cfg := cp.cfg
	var renter scheduler.Renter
	var laneStep scheduler.Lane
	var err error
	if cfg.Capacity != nil {
		capacity := *cfg.Capacity
		capacity.Budget = cp.usage
		if cp.rentals, err = rentals.New(capacity, cfg.Placement, cp.conn, rentalsKV, cp.nodesKV, cp.cache, cp.runs, cp.nodes, cfg.Now, cp.log); err != nil {
			return nil, nil, err
		}
		renter = cp.rentals
	}
	if cfg.Lane != nil {
		lc := *cfg.Lane
		lc.Timing = cfg.timing()
		if lc.RentalReady == 0 && cfg.Capacity != nil {
			lc.RentalReady = cfg.Capacity.ReadyEstimate
		}
		if cp.lane, err = lane.New(lc, cp.conn, cp.cache, cp.runs, cfg.Now, cp.log.Named("lane")); err != nil {
			return nil, nil, err
		}
		laneStep = cp.lane
	}
	return renter, laneStep, nil
}

// credentialServices makes the services that give nodes registry and
// artifact source credentials; grants is wf_artifact_grants.
func (cp *ControlPlane) credentialServices(grants jetstream.KeyValue) {
	cfg, conn, log := cp.cfg, cp.conn, cp.log
	// A node may have a credential for an image it has a live booking or
	// an open prefetch for.
	wanted := []registryauth.ImageWanted{registryauth.BookedImages(cp.cache), cp.prefetch.ImageTenants}
	cp.registryAuth = registryauth.NewService(conn, cp.cache, cp.nodesKV, cp.runsKV, cfg.RegistryAuth, wanted, cfg.CredentialLimit, cfg.Now, log)
	// Likewise for an artifact: a Run booked on the node that mounts it,
	// or an open prefetch of it there.
	cp.artifactAuth = artifactauth.NewService(conn, cp.cache, cp.nodesKV, cp.runsKV, grants,
		artifactauth.Config{URLs: cfg.ArtifactSourceAuth, GrantTTL: cfg.ArtifactGrantTTL, Limit: cfg.CredentialLimit, Now: cfg.Now,
			Wanted: []artifactauth.ArtifactWanted{cp.prefetch.ArtifactWanted}}, log)
}

// Prefetches is the prefetch service: its ImageTenants says whose live
// prefetches of an image wait on a node (the registry credential service
// asks it).
func (cp *ControlPlane) Prefetches() *prefetch.Service { return cp.prefetch }

// Artifacts is the artifact catalog intake resolves Runs' artifacts in.
func (cp *ControlPlane) Artifacts() *artifacts.Catalog { return cp.artifacts }

// Ready is closed once Run answers on every subject.
func (cp *ControlPlane) Ready() <-chan struct{} { return cp.ready }

// ObsWorkers is how many nodes' observations one replica handles at once.
const ObsWorkers = 16

// IntakeWorkers is how many intake messages one replica handles at once.
// It stays well below the intake consumer's MaxAckPending (1,024), so the
// workers' queues, not the server, hold the backlog.
const IntakeWorkers = 64

// Run serves until ctx ends: KV watches, the auth callout, intake,
// observation ingest, node and session services, the scheduler and, with
// Capacity, the rental manager. It returns the first error that stops a
// part, or nil after ctx ends.
func (cp *ControlPlane) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait() // runs last: after cancel below
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := cp.cache.Start(ctx, &wg, cp.runsKV, cp.nodesKV, cp.residencyKV, cp.log); err != nil {
		return err
	}
	// This replica has heard no heartbeat yet: give every node one lease
	// to be heard before the sweep may call it lost.
	cp.cache.GraceLeases(cp.cfg.Now().Add(cp.nodes.LeaseTTL()))
	// Every active Run's last events are checked against WF_EVENTS on the
	// first pass, in case a replica stopped between a write and its publish.
	cp.runs.RepairAllOnNextPass()
	stopServices, err := startAll(ctx, cp.services(&wg))
	if err != nil {
		return err
	}
	defer stopServices()
	stopStreams, err := cp.consumeStreams(ctx, &wg)
	if err != nil {
		return err
	}
	defer stopStreams()
	cp.dispatch.AskReconciliation(ctx)
	wg.Go(func() { cp.usage.Run(ctx) })
	wg.Go(func() { cp.scheduler.Run(ctx) })
	wg.Go(func() { cp.retention.Run(ctx) })
	if cp.lane != nil {
		wg.Go(func() { cp.lane.Run(ctx) })
	}
	if cp.rentals != nil {
		wg.Go(func() { cp.rentals.Run(ctx) })
	}
	close(cp.ready)
	cp.log.Info("control plane serving", zap.String("nats", cp.conn.NC.ConnectedUrlRedacted()))
	<-ctx.Done()
	return nil
}

// service starts one part's subscriptions and returns what stops them.
type service func(ctx context.Context) (stop func(), err error)

// services are the parts that answer on core NATS subjects, the auth
// callout first: an agent's login waits on it. Their pools and loops are
// owned by wg.
func (cp *ControlPlane) services(wg *sync.WaitGroup) []service {
	withWG := func(serve func(context.Context, *sync.WaitGroup) (func(), error)) service {
		return func(ctx context.Context) (func(), error) { return serve(ctx, wg) }
	}
	var out []service
	if cp.callout != nil {
		out = append(out, cp.callout.Serve)
	}
	out = append(out, withWG(cp.nodes.Serve), cp.sessions.Serve, withWG(cp.prefetch.Serve), withWG(cp.registryAuth.Serve),
		withWG(cp.artifactsService.Serve), withWG(cp.artifactAuth.Serve), withWG(cp.tenantRead.Serve))
	if cp.rentals != nil {
		out = append(out, cp.rentals.Serve)
	}
	if cp.rentals != nil || cp.lane != nil {
		out = append(out, withWG(cp.connections))
	}
	if cp.secretsService != nil {
		out = append(out, withWG(cp.secretsService.Serve))
	}
	if cp.secretAuth != nil {
		out = append(out, withWG(cp.secretAuth.Serve))
	}
	return out
}

// startAll starts each service in order; on a failure it stops those it
// started. The returned stop stops them all, the last started first.
func startAll(ctx context.Context, services []service) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	for _, s := range services {
		st, err := s(ctx)
		if err != nil {
			stop()
			return nil, err
		}
		stops = append(stops, st)
	}
	return stop, nil
}

// consumeStreams binds the intake and observation consumers, each feeding
// a keyed pool that wg owns.
func (cp *ControlPlane) consumeStreams(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	// A Run's submit and cancel go to the same intake worker, by Run id,
	// and keep their stream order.
	intakePool := keyed.NewPool(ctx, wg, keyed.PoolOptions{Workers: IntakeWorkers, Queue: IntakeWorkers * 8}, cp.intake.Handle)
	// Each tenant's intake stream has its own cp-intake durable; all feed
	// the one pool.
	var intakeStops []func()
	stopIntake := func() {
		for _, stop := range intakeStops {
			stop()
		}
	}
	for _, tenant := range cp.cfg.Tenants {
		stop, err := cp.consume(ctx, bus.RunsStream(tenant), bus.IntakeConsumerConfig(), func(m jetstream.Msg, redelivered bool) {
			job := intake.Parse(m, redelivered)
			intakePool.Submit(job.Key, job) // false only when ctx ended: m stays unacked and is redelivered
		})
		if err != nil {
			stopIntake()
			return nil, err
		}
		intakeStops = append(intakeStops, stop)
	}
	// Observations are handled by node: one node's reports (receipts,
	// workload phases, facts) keep their order, different nodes' run
	// concurrently.
	obsPool := keyed.NewPool(ctx, wg, keyed.PoolOptions{Workers: ObsWorkers, Queue: ObsWorkers * 8}, func(ctx context.Context, d delivery) {
		cp.ingest.Handle(ctx, d.m, d.redelivered)
	})
	stopObs, err := cp.consume(ctx, bus.StreamObs, bus.ObsConsumerConfig(), func(m jetstream.Msg, redelivered bool) {
		obsPool.Submit(bus.SubjectNode(m.Subject()), delivery{m, redelivered})
	})
	if err != nil {
		stopIntake()
		return nil, err
	}
	return func() { stopObs(); stopIntake() }, nil
}

// delivery is one stream message on its way to a worker; redelivered says
// it was delivered before, so its first handling may have stopped half way.
type delivery struct {
	m           jetstream.Msg
	redelivered bool
}

// consume binds a durable consumer and hands each message to h on the
// consumer's callback goroutine, in stream order.
func (cp *ControlPlane) consume(ctx context.Context, stream string, cfg jetstream.ConsumerConfig, h func(m jetstream.Msg, redelivered bool)) (stop func(), err error) {
	c, err := cp.conn.JS.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("controlplane: consumer %s on %s: %w", cfg.Durable, stream, err)
	}
	cc, err := c.Consume(func(m jetstream.Msg) {
		meta, err := m.Metadata()
		h(m, err == nil && meta.NumDelivered > 1)
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if !errors.Is(err, context.Canceled) {
			cp.log.Debug("consumer error", zap.String("consumer", cfg.Durable), zap.Error(err))
		}
	}))
	if err != nil {
		return nil, fmt.Errorf("controlplane: consume %s: %w", cfg.Durable, err)
	}
	return cc.Stop, nil
}

// Metrics returns the current counters and, once Ready is closed (the
// cache holds every Run wf_runs held when its watch started), the cached
// Runs by phase.
func (cp *ControlPlane) Metrics() Metrics {
	st := cp.scheduler.Stats()
	m := Metrics{
		Transitions: cp.runs.Transitions(), FencedObservations: cp.ingest.Fenced() + cp.nodes.Fenced(), Rejected: cp.intake.Rejected(),
		StaleReports: cp.ingest.Stale(), LeaseLapses: cp.nodes.LeaseLapses(), CommandsSent: cp.dispatch.Sent(),
		PlacementMisses: st.PlacementMisses.Load(), Decisions: st.Decisions.Load(), DecisionNanos: st.DecisionNanos.Load(),
		Heartbeats: cp.nodes.Heartbeats(), EventsPublished: cp.runs.EventsPublished(), RunsRemoved: cp.retention.Removed(), CachedRuns: cp.cache.RunCount(), Passes: st.Passes.Load(), DecidedAtIntake: st.DecidedAtIntake.Load(),
		RefusedObservations: cp.ingest.Refused(), PolicyReloadFailures: policyReloadFailures(cp.policy), Cost: cp.usage.Figures(cp.cfg.Now()),
	}
	select {
	case <-cp.ready:
		m.Phases, m.PhasesSynced = cp.cache.RunPhases(), true
	default:
	}
	return m
}
