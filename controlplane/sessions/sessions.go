// Package sessions is the control plane's side of session residency (see
// package residency): the residency stores agents reach over
// wf.node.<id>.residency.*, the operator's session attach and release, and
// the release of a draining node's sessions.
package sessions

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/residency/checkpoint"
	"github.com/warmfleet/warmfleet/schemas"
)

// Config tunes session residency (see package residency).
type Config struct {
	// LeaseTTL is each session lease's lifetime from its last renewal; a
	// lost host's sessions can be resumed elsewhere this long after its last
	// renewal. 15 s when zero.
	LeaseTTL time.Duration
	// InboxAckWait is how long inbox work taken by a host that then
	// vanished waits before it is redelivered to the next holder; it must
	// exceed the longest a session takes over one message. 30 s when zero.
	InboxAckWait time.Duration
	// AttachTimeout bounds one node's attach (an image pull included);
	// 2 min when zero.
	AttachTimeout time.Duration
	// DrainTimeout bounds a node's session drain; 60 s when zero.
	DrainTimeout time.Duration
	// Tenants are the configured tenants an operator's attach or release
	// may name (controlplane.Config.Tenants); none: any valid tenant name.
	Tenants []string
	// CheckpointsKept is how many of a session's latest workspace
	// checkpoints keep their content in wf_checkpoints; an older one's is
	// deleted once a newer one is committed. 3 when zero.
	CheckpointsKept int
}

func (c Config) withDefaults() Config {
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 15 * time.Second
	}
	if c.CheckpointsKept <= 0 {
		c.CheckpointsKept = 3
	}
	if c.InboxAckWait <= 0 {
		c.InboxAckWait = 30 * time.Second
	}
	if c.AttachTimeout <= 0 {
		c.AttachTimeout = 2 * time.Minute
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 60 * time.Second
	}
	return c
}

// Service serves session residency for the control plane.
type Service struct {
	cfg     Config
	conn    *bus.Conn
	cache   *cache.Cache
	nodesKV jetstream.KeyValue
	now     func() time.Time
	log     *zap.Logger
	// fleet is what is booked on each node (Runs and sessions), from which
	// an attach books a session's cards; booking serialises that choice.
	fleet   func(time.Time) *placement.Fleet
	booking sync.Mutex

	// serving holds the residency stores while Serve runs; nil otherwise.
	serving atomic.Pointer[stores]
}

// stores are the residency stores: served to agents (residency.go), read
// by the operator's requests and drains.
type stores struct {
	leases     *residency.KVLeases
	locations  *residency.KVLocations
	durable    *residency.KVSessions
	placements placements
	events     events
}

// New returns the session services. nodesKV is wf_nodes, read for the node
// an operator pins an attach to and for the host a release goes to; c gives
// the ready nodes an attach may go to. A nil now is time.Now; a nil log
// discards.
//
// fleet gives what is booked on each node now; an attach that asks for GPUs
// books free cards from it (nil: such an attach is refused).
func New(cfg Config, conn *bus.Conn, c *cache.Cache, nodesKV jetstream.KeyValue, fleet func(time.Time) *placement.Fleet, now func() time.Time, log *zap.Logger) *Service {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Service{cfg: cfg.withDefaults(), conn: conn, cache: c, nodesKV: nodesKV, fleet: fleet, now: now, log: log}
}

// Serve starts the residency stores' services to agents (residency.go) and
// the operator's session subjects (bus.SubjectSessionAttach,
// bus.SubjectSessionRelease), all on the one request server. The returned stop
// ends them and waits for the requests in flight.
func (s *Service) Serve(ctx context.Context) (stop func(), err error) {
	clock := residency.SystemClock{}
	leases, err := residency.NewKVLeases(ctx, residency.KVLeasesOptions{JS: s.conn.JS, TTL: s.cfg.LeaseTTL, InboxAckWait: s.cfg.InboxAckWait, Clock: clock, Logger: s.log})
	if err != nil {
		return nil, fmt.Errorf("sessions: leases: %w", err)
	}
	locs, err := residency.NewKVLocations(ctx, residency.KVLocationsOptions{JS: s.conn.JS, Clock: clock, Logger: s.log})
	if err != nil {
		return nil, fmt.Errorf("sessions: locations: %w", err)
	}
	durable, err := residency.NewKVSessions(ctx, residency.KVSessionsOptions{JS: s.conn.JS, Clock: clock, Logger: s.log})
	if err != nil {
		return nil, fmt.Errorf("sessions: durable state: %w", err)
	}
	leasesKV, err := s.conn.JS.KeyValue(ctx, bus.BucketLeases)
	if err != nil {
		return nil, fmt.Errorf("sessions: placements: %w", err)
	}
	bucket, err := checkpoint.OpenObjectBucket(ctx, s.conn.JS, bus.ObjectBucketCheckpoints)
	if err != nil {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	st := &stores{leases: leases, locations: locs, durable: durable, placements: placements{kv: leasesKV, now: s.now},
		events: events{js: s.conn.JS, now: s.now, log: s.log.Named("session-events")}}
	cps := &checkpoints{leases: leases, bucket: bucket, now: s.now}
	ctx, cancel := context.WithCancel(ctx)
	// wg owns every server's workers. An operator's attach may wait
	// minutes on an image pull, so each of those requests gets a goroutine
	// of its own (operatorServer); agents' requests go to each operation's
	// pool (residencyServer). It owns the deletion of checkpoints a session
	// no longer keeps, too (checkpoint.go, forget).
	var wg sync.WaitGroup
	durable.KeepCheckpoints(s.cfg.CheckpointsKept, func(key residency.Key, drop, keep []schemas.CheckpointRef) {
		wg.Go(func() { cps.forget(ctx, key, drop, keep, s.log) })
	})
	endpoints := append(st.residencyEndpoints(s.log.Named("residency-service")), cps.endpoints(s.log.Named("checkpoint-service"))...)
	stopAll, err := requests.Serve(ctx, &wg, s.conn.NC, append(endpoints,
		s.operatorServer(bus.SubjectSessionAttach, func(ctx context.Context, _ string, req schemas.SessionRequest) schemas.SessionReply {
			return s.attach(ctx, st, req)
		}),
		s.operatorServer(bus.SubjectSessionRelease, func(ctx context.Context, _ string, req schemas.SessionRequest) schemas.SessionReply {
			return s.release(ctx, st, req)
		}))...)
	if err != nil {
		cancel()
		wg.Wait()
		return nil, fmt.Errorf("sessions: %w", err)
	}
	s.serving.Store(st)
	var once sync.Once
	return func() {
		once.Do(func() {
			s.serving.CompareAndSwap(st, nil)
			stopAll()
			cancel()
			wg.Wait()
		})
	}, nil
}

// Routes lists every observation in wf_residency.
func (s *Service) Routes(ctx context.Context) ([]residency.Observation, error) {
	return ListRoutes(ctx, s.conn.JS)
}

// ListRoutes reads every observation in wf_residency, sorted by key.
func ListRoutes(ctx context.Context, js jetstream.JetStream) ([]residency.Observation, error) {
	kv, err := js.KeyValue(ctx, bus.BucketResidency)
	if err != nil {
		return nil, err
	}
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sort.Strings(keys)
	out := make([]residency.Observation, 0, len(keys))
	for _, k := range keys {
		var o residency.Observation
		if _, err := bus.GetJSON(ctx, kv, k, &o); err == nil {
			out = append(out, o)
		}
	}
	return out, nil
}
