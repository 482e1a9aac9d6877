// Package nodes is the control plane's node services: invitations and
// enrollment into the fenced registry (wf_nodes, wf_enroll), session
// renewals, heartbeats and the leases they earn, the sweep that marks a
// silent node lost, facts, drain, and what a node's disk must keep and the
// operator's prune (disk.go). Who may log in to NATS at all is
// controlplane/admission's.
package nodes

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/schemas"
)

// Config tunes the node services.
type Config struct {
	// HeartbeatInterval is what nodes are told to heartbeat at; a node's
	// lease is LeaseMultiplier heartbeats long.
	HeartbeatInterval time.Duration
	LeaseMultiplier   int
	// SessionTTL is how long an enrollment's session token is good for.
	SessionTTL time.Duration
	// CommandAckWait is how long a node's command waits for an ack before
	// JetStream redelivers it.
	CommandAckWait time.Duration
	// OpenEnrollment admits nodes that present no enrollment token.
	OpenEnrollment bool
	// RentedPrices: a rented node costs what its rental does (a capacity
	// provider is configured).
	RentedPrices bool
	// ControlPlaneCA is the NATS server's CA (PEM), written into every
	// bootstrap; empty when the server has no TLS.
	ControlPlaneCA string
	Now            func() time.Time
}

// Drainer releases the sessions resident on a draining node.
type Drainer interface {
	DrainNode(ctx context.Context, rec schemas.NodeRecord) *schemas.DrainView
}

// Service serves the node subjects.
type Service struct {
	cfg                          Config
	conn                         *bus.Conn
	nodesKV, enrollKV, rentalsKV jetstream.KeyValue
	cache                        *cache.Cache
	runs                         *runs.Store
	sessions                     Drainer // nil: no session residency
	keepers                      []DiskKeeper
	poke                         func()
	log                          *zap.Logger

	// enrollLocks orders enrollments of one node in this replica; different
	// nodes enroll concurrently. Across replicas the node record's CAS
	// decides.
	enrollLocks keyed.Mutex

	heartbeats, leaseLapses, fenced atomic.Int64
}

// New returns the node services. poke asks the scheduler for a pass (a
// node joined); sessions may be nil.
func New(cfg Config, conn *bus.Conn, nodesKV, enrollKV, rentalsKV jetstream.KeyValue, c *cache.Cache, store *runs.Store, sessions Drainer, poke func(), log *zap.Logger) *Service {
	return &Service{cfg: cfg, conn: conn, nodesKV: nodesKV, enrollKV: enrollKV, rentalsKV: rentalsKV, cache: c, runs: store, sessions: sessions, poke: poke, log: log}
}

// Heartbeats counts heartbeats that extended a lease; LeaseLapses counts
// nodes marked lost; Fenced counts heartbeats from superseded sessions or
// wrong subjects.
func (s *Service) Heartbeats() int64  { return s.heartbeats.Load() }
func (s *Service) LeaseLapses() int64 { return s.leaseLapses.Load() }
func (s *Service) Fenced() int64      { return s.fenced.Load() }

// LeaseTTL is how long a heartbeat keeps a node live.
func (s *Service) LeaseTTL() time.Duration {
	return s.cfg.HeartbeatInterval * time.Duration(s.cfg.LeaseMultiplier)
}

// enrollWorkers bounds how many enrollments one replica handles at once.
// Each is a few KV and JetStream API round trips; enrollments of one node
// are ordered by the per-node lock in enroll.
const enrollWorkers = 32

// Serve answers enrollments, renewals, invitations, drains, lease queries,
// prunes and disk-keep questions on the request server, and takes
// heartbeats, until ctx ends or stop is called. All are core NATS (not
// streams): a lost heartbeat is replaced by the next one, and a request is
// retried by its sender. The queue group spreads requests over replicas;
// heartbeats are published, not requests, and taken by every replica (no
// queue group), so each one's in-memory lease table is complete. The
// request workers are owned by wg and stopped by ctx.
func (s *Service) Serve(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	enroll := requests.Coded(bus.SubjectEnroll, "body is not an EnrollmentRequest", (*schemas.EnrollmentRequest).Validate, s.answerEnroll, s.log)
	enroll.Pool = keyed.PoolOptions{Workers: enrollWorkers, Queue: enrollWorkers * 4}
	subs, err := requests.Serve(ctx, wg, s.conn.NC,
		enroll,
		renewalServer(s.renew, s.log),
		requests.Coded(bus.SubjectInvite, "body is not an InviteRequest", (*schemas.InviteRequest).Validate, s.answerInvite, s.log),
		s.drainServer(),
		s.leasesServer(),
		s.pruneServer(),
		requests.Coded(bus.SubjectDiskKeepAll, "body is not a DiskKeepRequest", (*schemas.DiskKeepRequest).Validate, s.diskKeep, s.log),
	)
	if err != nil {
		return nil, err
	}
	hb, err := s.conn.NC.Subscribe(bus.SubjectHeartbeats, func(m *nats.Msg) { s.handleHeartbeat(ctx, m) })
	if err != nil {
		subs()
		return nil, fmt.Errorf("nodes: subscribe %s: %w", bus.SubjectHeartbeats, err)
	}
	return func() { subs(); _ = hb.Unsubscribe() }, nil
}
