// Package prefetch is the control plane's prefetches: an operator's request
// to warm an image, or a catalog artifact, on nodes before Runs need it
// (wf.admin.prefetch), the node selector and the choice of nodes, the
// record of each node's progress in wf_prefetch, the PrepareImage or
// PrepareArtifact commands, and what nodes report back.
package prefetch

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/schemas"
)

// DefaultFlushInterval is how often progress reports are written to the
// prefetch records: at most one write per record per interval, however
// many nodes report.
const DefaultFlushInterval = time.Second

// Service serves prefetches on one control-plane replica. Every replica
// mirrors wf_prefetch, so any of them answers Wants.
type Service struct {
	kv       jetstream.KeyValue
	nc       *nats.Conn
	cache    *cache.Cache
	dispatch *dispatch.Dispatcher
	now      func() time.Time
	flush    time.Duration
	log      *zap.Logger
	// artifacts resolves an artifact prefetch's reference; nil refuses
	// artifact prefetches.
	artifacts ArtifactResolver
	// tenants are the configured tenants a prefetch may name.
	tenants []string

	mu sync.Mutex
	// records is this replica's copy of wf_prefetch, with the stored bytes
	// to seed the next CAS.
	records map[string]mirrored
	// wanted counts, per node and image or artifact, the live prefetches
	// whose entry for that node is unfinished, by prefetch id → deadline.
	wanted map[wantKey]map[string]time.Time
	// pending holds the latest progress reported per prefetch and node,
	// until the next flush writes it.
	pending map[string]map[string]schemas.ImageProgress
}

type mirrored struct {
	p    schemas.Prefetch
	seed bus.Seed
}

// wantKey is what a prefetch entry wants on a node: an image, or (image
// zero) an artifact by digest.
type wantKey struct {
	node     string
	image    schemas.ImageRef
	artifact string
}

// ArtifactResolver answers artifact uses from the catalog, with tenant's
// own and shared records only; a use it cannot answer is a
// *schemas.Refusal (CodeArtifactUnknown), any other error is transient.
type ArtifactResolver interface {
	Resolve(ctx context.Context, tenant string, uses []schemas.ArtifactUse) ([]schemas.ArtifactMount, error)
}

// Option configures a Service.
type Option func(*Service)

// WithArtifacts lets the service prefetch artifacts, resolved through r.
func WithArtifacts(r ArtifactResolver) Option { return func(s *Service) { s.artifacts = r } }

// WithTenants sets the configured tenants (controlplane.Config.Tenants) a
// prefetch may name; without it, or with none, only DefaultTenant.
func WithTenants(tenants []string) Option {
	return func(s *Service) { s.tenants = slices.Clone(tenants) }
}

// New returns the prefetch service over wf_prefetch (kv). flush is
// DefaultFlushInterval when zero.
func New(kv jetstream.KeyValue, nc *nats.Conn, c *cache.Cache, d *dispatch.Dispatcher, flush time.Duration, now func() time.Time, log *zap.Logger, opts ...Option) *Service {
	if flush <= 0 {
		flush = DefaultFlushInterval
	}
	s := &Service{kv: kv, nc: nc, cache: c, dispatch: d, now: now, flush: flush, log: log,
		records: map[string]mirrored{}, wanted: map[wantKey]map[string]time.Time{}, pending: map[string]map[string]schemas.ImageProgress{}}
	for _, o := range opts {
		o(s)
	}
	if len(s.tenants) == 0 {
		s.tenants = []string{schemas.DefaultTenant}
	}
	return s
}

// OpID is the operation id of a prefetch's PrepareImage (or
// PrepareArtifact) on one node: the
// same for every send, so the node applies it once, and distinct per node,
// as WF_CMDS and WF_OBS deduplicate across nodes. A node id too long to fit
// is replaced by a digest of it.
func OpID(prefetchID, nodeID string) string {
	op := prefetchID + "." + nodeID
	if len(op) > 120 {
		op = prefetchID + "." + schemas.PrefetchIDFor(nodeID)
	}
	return op + ".prefetch"
}

// Serve mirrors wf_prefetch, answers prefetch requests and writes progress,
// until ctx ends or stop is called; wg owns its goroutines.
func (s *Service) Serve(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	if err := bus.Mirror(ctx, wg, s.kv, s.apply); err != nil {
		return nil, err
	}
	stop, err = requests.Serve(ctx, wg, s.nc,
		requests.Coded(bus.SubjectPrefetch, "body is not a PrefetchRequest", (*schemas.PrefetchRequest).Validate, s.answer, s.log))
	if err != nil {
		return nil, err
	}
	wg.Go(func() { s.flushLoop(ctx) })
	return stop, nil
}

// apply takes a wf_prefetch update from the watch.
func (s *Service) apply(e jetstream.KeyValueEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := e.Key()
	if old, ok := s.records[key]; ok {
		if old.seed.Revision >= e.Revision() && e.Operation() == jetstream.KeyValuePut {
			return
		}
		s.unindexLocked(old.p)
		delete(s.records, key)
	}
	if e.Operation() != jetstream.KeyValuePut {
		return
	}
	var p schemas.Prefetch
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		s.log.Warn("prefetch record does not decode; ignored", zap.String("prefetch_id", key), zap.Error(err))
		return
	}
	s.noteLocked(p, bus.Seed{JSON: e.Value(), Revision: e.Revision()})
}

// note records a value this replica wrote, ahead of its watch.
func (s *Service) note(p schemas.Prefetch, rev uint64, raw []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.records[p.ID]; ok {
		if old.seed.Revision >= rev {
			return
		}
		s.unindexLocked(old.p)
	}
	s.noteLocked(p, bus.Seed{JSON: raw, Revision: rev})
}

func (s *Service) noteLocked(p schemas.Prefetch, seed bus.Seed) {
	s.records[p.ID] = mirrored{p: p, seed: seed}
	for _, n := range p.Nodes {
		if n.State.Finished() {
			continue
		}
		k := keyOf(p, n.NodeID)
		if s.wanted[k] == nil {
			s.wanted[k] = map[string]time.Time{}
		}
		s.wanted[k][p.ID] = p.ExpiresAt
	}
}

func (s *Service) unindexLocked(p schemas.Prefetch) {
	for _, n := range p.Nodes {
		k := keyOf(p, n.NodeID)
		delete(s.wanted[k], p.ID)
		if len(s.wanted[k]) == 0 {
			delete(s.wanted, k)
		}
	}
}

// Get returns this replica's copy of a prefetch.
func (s *Service) Get(id string) (schemas.Prefetch, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.records[id]
	return m.p, ok
}

func (s *Service) seed(id string) bus.Seed {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.records[id].seed
}
