package registryauth

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
	"github.com/warmfleet/warmfleet/controlplane/nodecreds"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/schemas"
)

// ImageWanted says whether node nodeID has a live reason to pull image
// ref: a booking (BookedImages) or a prefetch. The service gives a
// credential only when one of its ImageWanted says yes.
type ImageWanted func(nodeID string, ref schemas.ImageRef) bool

// BookedImages says yes for an image an active Run booked on the node is
// pinned to, in a phase from placed (queued included) to running.
func BookedImages(c *cache.Cache) ImageWanted {
	return func(nodeID string, ref schemas.ImageRef) bool {
		for _, r := range c.ActiveRuns() {
			if nodecreds.Booked(r, nodeID) && pinnedTo(r, ref) {
				return true
			}
		}
		return false
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
	if !s.wants(ctx, req, ref) {
		return refuse(schemas.CodeImageNotWanted, "reference", "node %s has no live booking or prefetch for this image; credentials are given only for the Runs booked on a node", req.NodeID)
	}
	c, err := s.source.Lookup(ctx, NoTenant, registry)
	if err != nil {
		s.log.Warn("registry credential source failed", zap.String("node_id", req.NodeID), zap.String("registry", registry), zap.Error(err))
		return refuse(schemas.CodeCredentialUnavailable, "", "the control plane's credential source for %s failed (%v); see its log", registry, err)
	}
	s.given.Add(1)
	s.log.Debug("registry credential given", zap.String("node_id", req.NodeID), zap.String("registry", registry),
		zap.String("image", req.Reference), zap.Stringer("credential", c))
	return schemas.Reply[schemas.RegistryCredential]{OK: &c}
}

// wants says whether the node has a live reason to pull ref. When the
// cache says no and the request names its Run, the Run is read from
// wf_runs: this replica's watch may not have seen the booking yet.
func (s *Service) wants(ctx context.Context, req schemas.RegistryCredentialRequest, ref schemas.ImageRef) bool {
	for _, w := range s.wanted {
		if w(req.NodeID, ref) {
			return true
		}
	}
	return req.RunID != "" && s.gate.BookedRun(ctx, req.NodeID, req.RunID, func(r *schemas.Run) bool { return r.ID == req.RunID && pinnedTo(r, ref) }) != nil
}
