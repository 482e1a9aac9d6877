// Package artifactauth gives a node's current session the credential of
// an artifact's source, per fetch: for the control plane's object store a
// one-time NATS login that may only read it (a grant in
// wf_artifact_grants, admitted once by the auth callout), for a URL the
// headers the control plane holds for it (URLSource).
package artifactauth

import (
	"context"
	"errors"
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
	"github.com/warmfleet/warmfleet/internal/randid"
	"github.com/warmfleet/warmfleet/schemas"
)

// DefaultGrantTTL is how long an object-store login is good for: to log in
// once, and for the connection it opens (the server closes it then). A
// fetch cut off by it asks again.
const DefaultGrantTTL = 15 * time.Minute

// ConsumerInactive is how long the consumer made for an object-store fetch
// outlives its last pull: the server deletes it then, so none outlives the
// fetch it was made for (the login may not delete it).
const ConsumerInactive = time.Minute

// ArtifactWanted says whether node nodeID has a live reason other than a
// booked Run (a prefetch) to fetch the artifact of digest, and from where.
type ArtifactWanted func(nodeID, digest string) (schemas.ArtifactSource, bool)

// Config tunes the service.
type Config struct {
	// URLs holds the headers for URL sources; nil fetches every URL
	// anonymously.
	URLs *URLSource
	// Wanted are the reasons besides a booked Run (prefetches).
	Wanted []ArtifactWanted
	// GrantTTL bounds an object-store login; DefaultGrantTTL when zero.
	GrantTTL time.Duration
	// Limit bounds each node's requests, and so the grants it holds;
	// nodecreds.DefaultLimit when zero.
	Limit nodecreds.Limit
	Now   func() time.Time
}

// Service answers wf.node.<id>.credentials.artifact.
type Service struct {
	cfg    Config
	gate   *nodecreds.Gate
	limit  *nodecreds.Limiter
	grants jetstream.KeyValue
	js     jetstream.JetStream
	server *requests.Server[schemas.ArtifactCredentialRequest, schemas.Reply[schemas.ArtifactCredential]]
	nc     *nats.Conn
	log    *zap.Logger

	given, refused atomic.Int64
}

// NewService returns the service over the control plane's cache and the
// wf_nodes, wf_runs and wf_artifact_grants buckets.
func NewService(conn *bus.Conn, c *cache.Cache, nodesKV, runsKV, grantsKV jetstream.KeyValue, cfg Config, log *zap.Logger) *Service {
	if cfg.GrantTTL <= 0 {
		cfg.GrantTTL = DefaultGrantTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Service{cfg: cfg, gate: nodecreds.NewGate(c, nodesKV, runsKV, cfg.Now), limit: nodecreds.NewLimiter(cfg.Limit, cfg.Now), grants: grantsKV, js: conn.JS, nc: conn.NC, log: log.Named("artifactauth")}
	s.server = &requests.Server[schemas.ArtifactCredentialRequest, schemas.Reply[schemas.ArtifactCredential]]{
		Subject: bus.SubjectArtifactCredentials, What: "artifact credential", Malformed: "body is not a artifact credential request",
		Validate: (*schemas.ArtifactCredentialRequest).Validate, Answer: s.Answer, Refuse: requests.Refusal[schemas.ArtifactCredential],
		Pool: requests.DefaultPool(), Refused: &s.refused, Log: s.log}
	return s
}

// Given counts credentials (anonymous answers included) handed out;
// Refused counts requests refused.
func (s *Service) Given() int64   { return s.given.Load() }
func (s *Service) Refused() int64 { return s.refused.Load() }

// Serve answers requests in the control plane's queue group until ctx
// ends or stop is called.
func (s *Service) Serve(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	return requests.Serve(ctx, wg, s.nc, s.server)
}

// Handle answers one request message (what Serve's workers run; the fuzz
// target's entry point).
func (s *Service) Handle(ctx context.Context, m *nats.Msg) { s.server.Handle(ctx, m) }

// Answer decides one valid request that came on subject. Every refusal is
// logged with its reason; a token or header value never is.
func (s *Service) Answer(ctx context.Context, subject string, req schemas.ArtifactCredentialRequest) schemas.Reply[schemas.ArtifactCredential] {
	refuse := func(code schemas.Code, field, format string, args ...any) schemas.Reply[schemas.ArtifactCredential] {
		r := &schemas.Refusal{Code: code, Field: field, Reason: fmt.Sprintf(format, args...)}
		s.refused.Add(1)
		s.log.Info("artifact credential refused", zap.String("node_id", req.NodeID), zap.Uint64("fencing_token", req.FencingToken),
			zap.String("digest", req.Digest), zap.String("run_id", req.RunID), zap.String("code", string(code)), zap.String("reason", r.Reason))
		return schemas.Reply[schemas.ArtifactCredential]{Refusal: r}
	}
	if r := s.gate.Session(ctx, subject, bus.NodeArtifactCredentials(req.NodeID), req.NodeID, req.FencingToken, "artifact credentials"); r != nil {
		return refuse(r.Code, r.Field, "%s", r.Reason)
	}
	// Limited before the grant is written: each answer may write one.
	if r := s.limit.Allow(req.NodeID, "artifact credentials"); r != nil {
		s.refused.Add(1)
		s.log.Info("artifact credential refused", zap.String("node_id", req.NodeID), zap.String("digest", req.Digest),
			zap.String("code", string(r.Code)), zap.String("reason", r.Reason))
		return schemas.Reply[schemas.ArtifactCredential]{Refusal: r}
	}
	src, ok := s.source(ctx, req)
	if !ok {
		return refuse(schemas.CodeArtifactNotWanted, "digest", "node %s has no live booking or prefetch of artifact %s; credentials are given only for the artifacts of Runs booked on a node", req.NodeID, req.Digest)
	}
	cred := schemas.ArtifactCredential{Digest: req.Digest}
	switch {
	case src.Object != "":
		login, read, err := s.grant(ctx, req, src.Object)
		switch {
		case errors.Is(err, jetstream.ErrObjectNotFound), errors.Is(err, bus.ErrObjectLink):
			return refuse(schemas.CodeArtifactFetchFailed, "digest", "the object store holds no content object %s for artifact %s; the operator registers the artifact again", src.Object, req.Digest)
		case err != nil:
			s.log.Warn("artifact grant not stored", zap.String("node_id", req.NodeID), zap.String("digest", req.Digest), zap.Error(err))
			return refuse(schemas.CodeInternal, "", "the control plane could not prepare the object's read (%v); ask again", err)
		}
		cred.Login, cred.Object = &login, &read
	case src.URL != "":
		cred.Headers = s.cfg.URLs.Headers(src.URL)
	}
	s.given.Add(1)
	s.log.Debug("artifact credential given", zap.String("node_id", req.NodeID), zap.String("digest", req.Digest),
		zap.String("run_id", req.RunID), zap.Stringer("credential", cred))
	return schemas.Reply[schemas.ArtifactCredential]{OK: &cred}
}

// source is where the node fetches req.Digest from, if it has a live
// reason to: a Run booked on it that mounts the artifact (the named Run
// first, read from wf_runs when this replica has not seen it yet), else a
// Wanted hook.
func (s *Service) source(ctx context.Context, req schemas.ArtifactCredentialRequest) (schemas.ArtifactSource, bool) {
	mounts := func(r *schemas.Run) bool {
		return (req.RunID == "" || r.ID == req.RunID) && slices.ContainsFunc(r.Artifacts, func(m schemas.ArtifactMount) bool { return m.Digest == req.Digest })
	}
	r := s.gate.BookedRun(ctx, req.NodeID, req.RunID, mounts)
	if r == nil && req.RunID != "" {
		// Another Run booked here may mount the same artifact.
		r = s.gate.BookedRun(ctx, req.NodeID, "", func(r *schemas.Run) bool {
			return slices.ContainsFunc(r.Artifacts, func(m schemas.ArtifactMount) bool { return m.Digest == req.Digest })
		})
	}
	if r != nil {
		i := slices.IndexFunc(r.Artifacts, func(m schemas.ArtifactMount) bool { return m.Digest == req.Digest })
		return r.Artifacts[i].Source, true
	}
	for _, w := range s.cfg.Wanted {
		if src, ok := w(req.NodeID, req.Digest); ok {
			return src, true
		}
	}
	return schemas.ArtifactSource{}, false
}

// grant creates the fetch's pull consumer of the object's chunks from the
// chunk holding req.Offset, mints a one-time login and stores its grant,
// naming that consumer, under the token's hash (the token itself is never
// stored), for the auth callout. The consumer is the control plane's to
// create because a login allowed to create one could make it durable or
// push its chunks to any subject.
func (s *Service) grant(ctx context.Context, req schemas.ArtifactCredentialRequest, object string) (schemas.ArtifactLogin, schemas.ArtifactObjectRead, error) {
	name := bus.ArtifactConsumer(req.NodeID, randid.Hex("", 8))
	meta := map[string]string{"node_id": req.NodeID, "digest": req.Digest}
	if req.RunID != "" {
		meta["run_id"] = req.RunID
	}
	if req.PrefetchID != "" {
		meta["prefetch_id"] = req.PrefetchID
	}
	r, err := bus.CreateObjectRead(ctx, s.js, bus.ObjectBucketArtifacts, object, req.Offset,
		bus.ObjectReadConfig{Name: name, Inactive: ConsumerInactive, Metadata: meta})
	if err != nil {
		return schemas.ArtifactLogin{}, schemas.ArtifactObjectRead{}, err
	}
	read := schemas.ArtifactObjectRead(r) // the same fields: a drift fails to compile
	token := randid.Token(32)
	expires := s.cfg.Now().Add(s.cfg.GrantTTL).Truncate(time.Second)
	g := schemas.ArtifactGrant{NodeID: req.NodeID, FencingToken: req.FencingToken, Digest: req.Digest, Object: object,
		Consumer: name, RunID: req.RunID, PrefetchID: req.PrefetchID, ExpiresAt: expires}
	if _, err := bus.CreateJSON(ctx, s.grants, schemas.ArtifactGrantKey(token), g); err != nil {
		// The consumer goes after ConsumerInactive unpulled.
		return schemas.ArtifactLogin{}, schemas.ArtifactObjectRead{}, err
	}
	return schemas.ArtifactLogin{User: bus.ArtifactUser(req.NodeID), Token: token, Expires: expires}, read, nil
}
