package registryauth

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/nodecreds"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/schemas"
)

// ImageWanted lists the tenants with a live reason for node nodeID to pull
// image ref: a booking (BookedImages) or a prefetch; none when there is no
// reason. The service gives a credential only when one of its ImageWanted
// names a tenant, and gives that tenant's.
type ImageWanted func(nodeID string, ref schemas.ImageRef) []string

// BookedImages names the tenants of the active Runs booked on the node,
// in a phase from placed (queued included) to running, that are pinned
// to the image.
func BookedImages(c *cache.Cache) ImageWanted {
	return func(nodeID string, ref schemas.ImageRef) []string {
		var tenants []string
		for _, r := range c.ActiveRuns() {
			if nodecreds.Booked(r, nodeID) && pinnedTo(r, ref) {
				tenants = append(tenants, r.TenantOf())
			}
		}
		return tenants
	}
}

// pinnedTo says whether r's image is ref.
func pinnedTo(r *schemas.Run, ref schemas.ImageRef) bool {
	booked, err := schemas.ParseImageRef("image", r.Request.Image)
	return err == nil && booked == ref
}

// Service answers wf.node.<id>.credentials.registry.
type Service struct {
	gate   *nodecreds.Gate
	limit  *nodecreds.Limiter
	server *requests.Server[schemas.RegistryCredentialRequest, schemas.Reply[schemas.RegistryCredential]]
	nc     *nats.Conn
	source *Source
	wanted []ImageWanted
	log    *zap.Logger

	given, refused atomic.Int64
}

// NewService returns the credential service. source may be nil (every
// registry anonymous); wanted are the reasons a node may have to pull an
// image (BookedImages, and prefetches); limit bounds each node's requests
// (nodecreds.DefaultLimit when zero).
func NewService(conn *bus.Conn, c *cache.Cache, nodesKV, runsKV jetstream.KeyValue, source *Source, wanted []ImageWanted, limit nodecreds.Limit, now func() time.Time, log *zap.Logger) *Service {
	s := &Service{gate: nodecreds.NewGate(c, nodesKV, runsKV, now), limit: nodecreds.NewLimiter(limit, now), source: source, wanted: wanted, nc: conn.NC, log: log.Named("registryauth")}
	s.server = &requests.Server[schemas.RegistryCredentialRequest, schemas.Reply[schemas.RegistryCredential]]{
		Subject: bus.SubjectRegistryCredentials, What: "registry credential", Malformed: "body is not a registry credential request",
		Validate: (*schemas.RegistryCredentialRequest).Validate, Answer: s.Answer, Refuse: requests.Refusal[schemas.RegistryCredential],
		Pool: requests.DefaultPool(), Refused: &s.refused, Log: s.log}
	return s
}

// Given counts credentials (anonymous answers included) handed out;
// Refused counts requests refused.
func (s *Service) Given() int64   { return s.given.Load() }
func (s *Service) Refused() int64 { return s.refused.Load() }

// Serve answers requests in the control plane's queue group until ctx
// ends or stop is called, by requests.DefaultPool's workers (a credential
// helper may take its whole timeout).
func (s *Service) Serve(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	return requests.Serve(ctx, wg, s.nc, s.server)
}

// Answer decides one valid request that came on subject: a refusal, or the
// credential of the image's registry (anonymous when the control plane
// holds none). Every refusal is logged with its reason; a credential never
// is.
func (s *Service) Answer(ctx context.Context, subject string, req schemas.RegistryCredentialRequest) schemas.Reply[schemas.RegistryCredential] {
	ref, _ := schemas.ParseImageRef("reference", req.Reference) // validated
	registry := ref.Registry()
	refuse := func(code schemas.Code, field, format string, args ...any) schemas.Reply[schemas.RegistryCredential] {
		r := &schemas.Refusal{Code: code, Field: field, Reason: fmt.Sprintf(format, args...)}
		s.refused.Add(1)
		s.log.Info("registry credential refused", zap.String("node_id", req.NodeID), zap.Uint64("fencing_token", req.FencingToken),
			zap.String("registry", registry), zap.String("image", req.Reference), zap.String("code", string(code)), zap.String("reason", r.Reason))
		return schemas.Reply[schemas.RegistryCredential]{Refusal: r}
	}
	if r := s.gate.Session(ctx, subject, bus.NodeRegistryCredentials(req.NodeID), req.NodeID, req.FencingToken, "registry credentials"); r != nil {
		return refuse(r.Code, r.Field, "%s", r.Reason)
	}
	// Limited before the helper runs: each answer may run one.
	if r := s.limit.Allow(req.NodeID, "registry credentials"); r != nil {
		s.refused.Add(1)
		s.log.Info("registry credential refused", zap.String("node_id", req.NodeID), zap.String("registry", registry),
			zap.String("code", string(r.Code)), zap.String("reason", r.Reason))
		return schemas.Reply[schemas.RegistryCredential]{Refusal: r}
	}
	tenant, ok := s.wants(ctx, req, ref)
	if !ok {
		return refuse(schemas.CodeImageNotWanted, "reference", "node %s has no live booking or prefetch for this image; credentials are given only for the Runs booked on a node", req.NodeID)
	}
	c, err := s.source.Lookup(ctx, tenant, registry)
	if err != nil {
		s.log.Warn("registry credential source failed", zap.String("node_id", req.NodeID), zap.String("registry", registry), zap.String("tenant", string(tenant)), zap.Error(err))
		return refuse(schemas.CodeCredentialUnavailable, "", "the control plane's credential source for %s failed (%v); see its log", registry, err)
	}
	s.given.Add(1)
	s.log.Debug("registry credential given", zap.String("node_id", req.NodeID), zap.String("registry", registry),
		zap.String("image", req.Reference), zap.String("tenant", string(tenant)), zap.Stringer("credential", c))
	return schemas.Reply[schemas.RegistryCredential]{OK: &c}
}

// wants says whether the node has a live reason to pull ref, and whose
// credentials serve it. A pull for a named Run booked on the node is that
// Run's tenant's (the Run is read from wf_runs when this replica's watch
// has not seen the booking yet). Otherwise the tenants of every reason
// count: one tenant gets its own; several get the fleet's only
// (NoTenant), as no tenant's credential may serve another tenant's reason.
func (s *Service) wants(ctx context.Context, req schemas.RegistryCredentialRequest, ref schemas.ImageRef) (Tenant, bool) {
	if req.RunID != "" {
		if r := s.gate.BookedRun(ctx, req.NodeID, req.RunID, func(r *schemas.Run) bool { return r.ID == req.RunID && pinnedTo(r, ref) }); r != nil {
			return Tenant(r.TenantOf()), true
		}
	}
	var tenants []string
	for _, w := range s.wanted {
		tenants = append(tenants, w(req.NodeID, ref)...)
	}
	slices.Sort(tenants)
	switch tenants = slices.Compact(tenants); len(tenants) {
	case 0:
		return NoTenant, false
	case 1:
		return Tenant(tenants[0]), true
	}
	return NoTenant, true
}
