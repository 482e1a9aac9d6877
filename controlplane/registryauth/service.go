package registryauth

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/internal/keyed"
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
			if bookedOn(r, nodeID, ref) {
				return true
			}
		}
		return false
	}
}

// bookedOn says whether r is booked on nodeID, pinned to ref, in a phase
// from placed to running.
func bookedOn(r *schemas.Run, nodeID string, ref schemas.ImageRef) bool {
	if r.NodeID != nodeID {
		return false
	}
	switch r.Phase {
	case schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning:
	default:
		return false
	}
	booked, err := schemas.ParseImageRef("image", r.Request.Image)
	return err == nil && booked == ref
}

// Workers bounds how many credential requests one replica answers at once
// (a helper may take its whole timeout).
const Workers = 16

// Service answers wf.node.<id>.credentials.registry.
type Service struct {
	conn            *bus.Conn
	cache           *cache.Cache
	nodesKV, runsKV jetstream.KeyValue
	source          *Source
	wanted          []ImageWanted
	now             func() time.Time
	log             *zap.Logger

	given, refused atomic.Int64
}

// NewService returns the credential service. source may be nil (every
// registry anonymous); wanted are the reasons a node may have to pull an
// image (BookedImages, and prefetches).
func NewService(conn *bus.Conn, c *cache.Cache, nodesKV, runsKV jetstream.KeyValue, source *Source, wanted []ImageWanted, now func() time.Time, log *zap.Logger) *Service {
	return &Service{conn: conn, cache: c, nodesKV: nodesKV, runsKV: runsKV, source: source, wanted: wanted, now: now, log: log.Named("registryauth")}
}

// Given counts credentials (anonymous answers included) handed out;
// Refused counts requests refused.
func (s *Service) Given() int64   { return s.given.Load() }
func (s *Service) Refused() int64 { return s.refused.Load() }

// Serve answers requests in the control plane's queue group until ctx
// ends or stop is called. Requests are answered by a pool of workers that
// wg owns, so a slow helper holds up no other request.
func (s *Service) Serve(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	pool := keyed.NewPool(ctx, wg, keyed.PoolOptions{Workers: Workers, Queue: Workers * 4}, s.handle)
	subs, err := bus.QueueSubscribeAll(s.conn.NC, map[string]nats.MsgHandler{
		// Keyed by reply inbox only to spread the load.
		bus.SubjectRegistryCredentials: func(m *nats.Msg) { pool.Submit(m.Reply, m) },
	})
	if err != nil {
		return nil, err
	}
	return subs.Stop, nil
}

func (s *Service) handle(ctx context.Context, m *nats.Msg) {
	var req schemas.RegistryCredentialRequest
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = req.Validate()
	}
	var rep schemas.Reply[schemas.RegistryCredential]
	if err != nil {
		rep.Refusal = schemas.RefusalOfInput(err, "body is not a RegistryCredentialRequest")
		s.refused.Add(1)
		s.log.Info("registry credential refused", zap.String("subject", m.Subject), zap.String("code", string(rep.Refusal.Code)),
			zap.String("reason", rep.Refusal.Reason))
	} else {
		rep = s.Answer(ctx, m.Subject, req)
	}
	if err := bus.Respond(m, enc, rep); err != nil {
		s.log.Error("reply", zap.String("subject", m.Subject), zap.Error(err))
	}
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
	if subject != bus.NodeRegistryCredentials(req.NodeID) {
		return refuse(schemas.CodeWrongNode, "node_id", "a node asks for credentials on its own subject, %s", bus.NodeRegistryCredentials(req.NodeID))
	}
	node, err := s.node(ctx, req.NodeID, req.FencingToken)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return refuse(schemas.CodeUnknownNode, "node_id", "node %s is not enrolled; enroll it before it pulls", req.NodeID)
	case err != nil:
		return refuse(schemas.CodeInternal, "", "the node registry could not be read (%v); the pull may retry", err)
	case req.FencingToken != node.FencingToken:
		return refuse(schemas.CodeStaleFencingToken, "fencing_token", "token %d is not node %s's current session (%d); only the current session gets credentials",
			req.FencingToken, req.NodeID, node.FencingToken)
	case !node.Live(s.now()):
		return refuse(schemas.CodeSessionExpired, "", "node %s's lease has lapsed; it gets credentials again once it heartbeats", req.NodeID)
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
	if req.RunID == "" {
		return false
	}
	var r schemas.Run
	if _, err := bus.GetJSON(ctx, s.runsKV, req.RunID, &r); err != nil {
		return false
	}
	return bookedOn(&r, req.NodeID, ref)
}

// node returns the node's record from the cache, or from wf_nodes when the
// request names a newer session than the cache has seen yet (this
// replica's watch may lag the enrollment).
func (s *Service) node(ctx context.Context, nodeID string, token uint64) (schemas.NodeRecord, error) {
	n, ok := s.cache.Node(nodeID)
	if ok && token <= n.FencingToken {
		return n, nil
	}
	var rec schemas.NodeRecord
	rev, err := bus.GetJSON(ctx, s.nodesKV, nodeID, &rec)
	if err != nil {
		return schemas.NodeRecord{}, err
	}
	s.cache.NoteNode(rec, rev)
	n, _ = s.cache.Node(nodeID)
	return n, nil
}
