package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/agent/artifactstore"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Version is the agent build reported at enrollment.
const Version = "0.1.0"

// Config describes one node agent.
type Config struct {
	NodeID     string
	RentalID   string
	Generation uint64
	// EnrollmentToken is the bootstrap secret; it is sent once and never
	// logged. After enrolling, the agent resumes with its saved session.
	EnrollmentToken string
	// DataDir holds the operation journal.
	DataDir string
	// Capacity is what this node offers; zero fields are filled from facts.
	Capacity     schemas.Resources
	MaxWorkloads int
	// StopGrace is used when the node itself stops a workload (max runtime).
	StopGrace time.Duration
	// ContentRoot is the filesystem holding the runtime's content (e.g.
	// /var/lib/containerd), measured for disk facts; empty states disk unknown.
	ContentRoot string
	// CacheDir holds the caches Runs mount; <DataDir>/caches when empty.
	CacheDir string
	// ArtifactDir holds the node's artifact replicas (agent/artifactstore);
	// <DataDir>/artifacts when empty.
	ArtifactDir string
	// ArtifactHTTP fetches artifacts from URL sources; nil uses a client
	// that bounds the wait for a response but not the transfer.
	ArtifactHTTP *http.Client
	// Accelerator measures the host's cards (adapters/gpuprobe runs
	// cmd/warmfleet-gpu-probe); nil states nothing established.
	Accelerator AcceleratorProbe
	// AcceleratorTimeout bounds one accelerator probe in a facts report;
	// DefaultAcceleratorTimeout when zero.
	AcceleratorTimeout time.Duration
	// FactsInterval is how often facts are reported; DefaultFactsInterval
	// when zero. Changes (an image ensured, a workload exited) report sooner.
	FactsInterval time.Duration
	// ProgressInterval is how often an image transfer under way is
	// reported; DefaultProgressInterval when zero.
	ProgressInterval time.Duration
	Now              func() time.Time
	// Faults injects crashes for fault tests; nil in production.
	Faults *Faults
	// Sessions hosts resident sessions (residency/nodehost); nil hosts none.
	Sessions noderuntime.SessionHost
	// NetworkModes are the network modes this node gives Runs (values of
	// noderuntime.NetworkMode), reported in facts; a launch asking for
	// another is refused. Nil offers every mode.
	NetworkModes []string
	// LogRate and LogBurst bound how fast one Run's output is kept, both
	// streams together (bytes per second, bytes); past them output is
	// dropped and a marker line says how much. DefaultLogRate and
	// DefaultLogBurst when zero; a negative LogRate keeps everything.
	LogRate, LogBurst int64
	// LogPoll is how often a running attempt's output is read for new
	// lines; DefaultLogPoll when zero.
	LogPoll time.Duration
	// LogShipTimeout bounds how long an exit report waits for the attempt's
	// output to be stored; DefaultLogShipTimeout when zero. Shipping goes
	// on after it.
	LogShipTimeout time.Duration
	// LogDialer opens each Run's log connection; nil ships on the agent's
	// own connection (output.go).
	LogDialer LogDialer
	// LogMetrics, when set, receives the shipping figures.
	LogMetrics LogMetrics
	// ImageMetrics, when set, receives image fetch and credential timings.
	ImageMetrics ImageMetrics
	// DiskWatermarks, when set, turn on disk collection: past High percent
	// of ContentRoot's filesystem used, the agent removes images and
	// caches least recently used first until at most Low percent is used
	// (disk.go). Nil collects nothing on its own; a prune still works.
	DiskWatermarks *schemas.DiskWatermarks
	// DiskMetrics, when set, counts evictions.
	DiskMetrics DiskMetrics
	// Credentials, when set, are what the agent's NATS connection logs in
	// with (NATS auth on; see bus/auth.go and docs/security.md). The agent
	// puts its saved session token, or else its bootstrap token, in them
	// before enrolling, and its new session token after, reconnecting each
	// time. They must be the ones the connection was built with
	// (Credentials.Options). Nil: the connection needs no login.
	Credentials *bus.Credentials
	// ArtifactTransport is how an artifact login's own connection reaches
	// NATS (bus.DialArtifactLogin); nil: the main connection's servers and
	// TLS (bus.TransportOf).
	ArtifactTransport *bus.Transport
}

// Faults are the crash points fault tests use to prove invariant 1 (one
// operation id, one effect) across a real agent restart.
type Faults struct {
	// LeaveUnacked is consulted after a command's effect, journal entry and
	// receipt: returning true leaves it unacked, as if the process died
	// before acking, so JetStream redelivers it after AckWait.
	LeaveUnacked func(schemas.Command) bool
	// SkipJournal is consulted after a command's effect: returning true
	// drops the journal entry and the ack, as if the process died between
	// the effect and the journal write.
	SkipJournal func(schemas.Command) bool
}

// Agent is one node's agent. Run drives it.
type Agent struct {
	cfg     Config
	conn    *bus.Conn
	rt      noderuntime.Runtime
	log     *zap.Logger
	journal *Journal
	accel   *boundedProbe
	// factsChanged wakes the facts loop; rt (a changeWatch) signals it.
	factsChanged chan struct{}
	// launches counts rt's launches in flight: facts wait for them.
	launches *launchGate

	mu  sync.Mutex
	enr schemas.Enrollment
	// watching holds the workloads this process waits on, by workload id.
	watching map[string]context.CancelFunc
	// shipments are the output directories being shipped, by attempt id.
	shipments map[string]*shipment
	behind    *backlog
	// held is what each attempt prepared or launched here uses on disk,
	// by attempt id, until its workload is removed (disk.go).
	held map[string]heldItems
	// failedPrep: attempts whose preparation failed, with the code their
	// launch fails with (artifacts.go).
	failedPrep map[string]prepFailure
	// artifacts is the node's replica store.
	artifacts *artifactstore.Store
	// diskMu: a disk sweep holds it to write; a prepare or launch holds it
	// to read while it ensures the image, mounts caches and starts, so a
	// sweep never removes what one is about to use.
	diskMu sync.RWMutex
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = schemas.DefaultGraceSeconds * time.Second
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(cfg.DataDir, "caches")
	}
	if cfg.ArtifactDir == "" {
		cfg.ArtifactDir = filepath.Join(cfg.DataDir, "artifacts")
	}
	if cfg.FactsInterval <= 0 {
		cfg.FactsInterval = DefaultFactsInterval
	}
	if cfg.AcceleratorTimeout <= 0 {
		cfg.AcceleratorTimeout = DefaultAcceleratorTimeout
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = DefaultProgressInterval
	}
	if cfg.LogRate == 0 {
		cfg.LogRate = DefaultLogRate
	}
	if cfg.LogBurst <= 0 {
		cfg.LogBurst = DefaultLogBurst
	}
	if cfg.LogPoll <= 0 {
		cfg.LogPoll = DefaultLogPoll
	}
	if cfg.LogShipTimeout <= 0 {
		cfg.LogShipTimeout = DefaultLogShipTimeout
	}
	if w := cfg.DiskWatermarks; w != nil {
		if err := w.Validate(); err != nil {
			return nil, fmt.Errorf("agent: disk watermarks: %w", err)
		}
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
	changed, launches := make(chan struct{}, 1), newLaunchGate()
	a := &Agent{cfg: cfg, conn: conn, rt: changeWatch{Runtime: rt, changed: changed, launches: launches}, log: log, journal: j,
		accel: &boundedProbe{probe: cfg.Accelerator, timeout: cfg.AcceleratorTimeout, log: log}, factsChanged: changed, launches: launches,
		watching: map[string]context.CancelFunc{}, shipments: map[string]*shipment{}, held: map[string]heldItems{},
		failedPrep: map[string]prepFailure{}, artifacts: store,
		behind: &backlog{metrics: cfg.LogMetrics, bytes: map[string][2]int64{}}}
	return a, nil
}

// Enrollment returns the current session (zero before enrolling).
func (a *Agent) Enrollment() schemas.Enrollment {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.enr
}

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

	facts := a.facts(ctx)
	enr, err := a.enroll(ctx, facts)
	if err != nil {
		return err
	}
	cons, err := a.conn.JS.Consumer(ctx, bus.StreamCmds, enr.Consumer)
	if err != nil {
		return fmt.Errorf("agent: bind command consumer %s: %w", enr.Consumer, err)
	}
	if err := a.reconcile(ctx, facts); err != nil {
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

// enroll asks the control plane for a session, retrying until it answers:
// a core request has no redelivery, and an agent started before its control
// plane must wait for it.
func (a *Agent) enroll(ctx context.Context, facts schemas.NodeFacts) (schemas.Enrollment, error) {
	capacity := a.cfg.Capacity
	if capacity.CPUMillis == 0 {
		capacity.CPUMillis = facts.Host.CPUMillis
	}
	if capacity.MemoryBytes == 0 {
		capacity.MemoryBytes = facts.Host.MemoryBytes
	}
	if capacity.GPUCount == 0 {
		capacity.GPUCount = facts.Host.Accelerator.GPUCount()
	}
	token, generation, resuming := a.loadSession()
	if !resuming {
		token, generation = a.cfg.EnrollmentToken, a.cfg.Generation
	}
	if err := a.login(ctx, token, resuming && a.cfg.EnrollmentToken != ""); err != nil {
		if !errors.Is(err, ErrLoginRefused) {
			return schemas.Enrollment{}, err
		}
		// NATS refuses the saved session (expired, or superseded by another
		// enrollment); the bootstrap token may still admit the node.
		a.log.Info("NATS refused the saved session; logging in with the bootstrap token")
		resuming, token, generation = false, a.cfg.EnrollmentToken, a.cfg.Generation
		if err := a.login(ctx, token, false); err != nil {
			return schemas.Enrollment{}, err
		}
	}
	req := schemas.EnrollmentRequest{
		NodeID: a.cfg.NodeID, RentalID: a.cfg.RentalID, Generation: generation,
		EnrollmentToken: token, AgentVersion: Version,
		Capacity: capacity, MaxWorkloads: a.cfg.MaxWorkloads, Facts: facts,
	}
	wait := 250 * time.Millisecond
	for {
		var rep schemas.Reply[schemas.Enrollment]
		err := a.request(ctx, bus.SubjectEnroll, req, &rep)
		if err == nil {
			if rep.Refusal != nil && resuming && a.cfg.EnrollmentToken != "" {
				// The saved session is gone (expired, superseded); a fresh
				// bootstrap token admits the node anew.
				a.log.Info("saved session refused; enrolling with the bootstrap token", zap.String("code", string(rep.Refusal.Code)))
				resuming, req.EnrollmentToken, req.Generation = false, a.cfg.EnrollmentToken, a.cfg.Generation
				if err := a.login(ctx, req.EnrollmentToken, false); err != nil {
					return schemas.Enrollment{}, err
				}
				continue
			}
			if rep.Refusal != nil {
				return schemas.Enrollment{}, fmt.Errorf("agent: enrollment refused (resuming a saved session: %v): %w", resuming, rep.Refusal)
			}
			if rep.OK == nil {
				return schemas.Enrollment{}, errors.New("agent: enrollment reply carried neither a session nor a refusal")
			}
			if err := a.saveSession(*rep.OK); err != nil {
				return schemas.Enrollment{}, err
			}
			// From here on the connection acts as the enrolled node.
			if err := a.login(ctx, rep.OK.SessionToken, false); err != nil {
				return schemas.Enrollment{}, err
			}
			a.mu.Lock()
			a.enr = *rep.OK
			a.mu.Unlock()
			return *rep.OK, nil
		}
		if errors.Is(err, codec.ErrMalformed) {
			return schemas.Enrollment{}, fmt.Errorf("agent: enrollment reply: %w", err)
		}
		a.log.Info("control plane not answering enrollment yet", zap.Error(err))
		select {
		case <-ctx.Done():
			return schemas.Enrollment{}, fmt.Errorf("agent: enroll: %w", ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, 5*time.Second)
	}
}

// heartbeat publishes liveness until ctx ends.
func (a *Agent) heartbeat(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = 2 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		enr := a.Enrollment()
		a.mu.Lock()
		running := len(a.watching)
		a.mu.Unlock()
		hb := schemas.Heartbeat{NodeID: a.cfg.NodeID, FencingToken: enr.FencingToken, SentAt: a.cfg.Now(), Running: running}
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

// publish sends one observation under the current session. dedupeID, when
// set, lets JetStream drop a repeat of the same report.
func (a *Agent) publish(ctx context.Context, o schemas.Observation, dedupeID string) error {
	enr := a.Enrollment()
	o.NodeID, o.FencingToken, o.Generation = a.cfg.NodeID, enr.FencingToken, enr.Generation
	b, err := codec.Encode(codec.MsgPack, o)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: bus.NodeObs(a.cfg.NodeID), Data: b}
	var opts []jetstream.PublishOpt
	if dedupeID != "" {
		opts = append(opts, jetstream.WithMsgID(dedupeID))
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := a.conn.JS.PublishMsg(pctx, m, opts...); err != nil {
		return fmt.Errorf("agent: publish %s: %w", o.Kind, err)
	}
	return nil
}
