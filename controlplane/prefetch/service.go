// Package prefetch is the control plane's prefetches: an operator's request
// to warm an image, or a catalog artifact, on nodes before Runs need it
// (wf.admin.prefetch), the node selector and the choice of nodes, the
// record of each node's progress in wf_prefetch, the PrepareImage or
// PrepareArtifact commands, and what nodes report back.
package prefetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
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

// ArtifactResolver answers artifact uses from the catalog; a use it cannot
// answer is a *schemas.Refusal (CodeArtifactUnknown), any other error is
// transient.
type ArtifactResolver interface {
	Resolve(ctx context.Context, uses []schemas.ArtifactUse) ([]schemas.ArtifactMount, error)
}

// Option configures a Service.
type Option func(*Service)

// WithArtifacts lets the service prefetch artifacts, resolved through r.
func WithArtifacts(r ArtifactResolver) Option { return func(s *Service) { s.artifacts = r } }

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
	subs, err := bus.QueueSubscribeAll(s.nc, map[string]nats.MsgHandler{
		bus.SubjectPrefetch: func(m *nats.Msg) { s.handleRequest(ctx, m) },
	})
	if err != nil {
		return nil, err
	}
	wg.Go(func() { s.flushLoop(ctx) })
	return subs.Stop, nil
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

// keyOf is what a prefetch wants on a node.
func keyOf(p schemas.Prefetch, nodeID string) wantKey {
	if p.Artifact != nil {
		return wantKey{node: nodeID, artifact: p.Artifact.Digest}
	}
	return wantKey{node: nodeID, image: imageOf(p)}
}

// imageOf is the image a prefetch pulls, by repository and digest: a
// credential is asked for a registry, so the digest alone would let a
// prefetch from one registry unlock another's.
func imageOf(p schemas.Prefetch) schemas.ImageRef {
	ref, err := schemas.ParseImageRef("image", p.Image)
	if err != nil { // validated at intake; a record that fails wants nothing
		return schemas.ImageRef{}
	}
	return ref
}

// Wants says whether a live prefetch still waits for node nodeID to hold
// image ref: its entry is neither ready, failed
// nor skipped, and the prefetch has not timed out. The registry credential
// service asks it before it answers a node that has no booking for the
// image.
func (s *Service) Wants(nodeID string, ref schemas.ImageRef) bool {
	if ref == (schemas.ImageRef{}) {
		return false // the key of artifact entries
	}
	return s.wants(wantKey{node: nodeID, image: ref})
}

// WantsArtifact says whether a live prefetch still waits for node nodeID
// to hold the artifact of digest, as Wants does for an image. The artifact
// credential service asks it before it answers a node that has no booking
// for the artifact.
func (s *Service) WantsArtifact(nodeID, digest string) bool {
	if digest == "" {
		return false
	}
	return s.wants(wantKey{node: nodeID, artifact: digest})
}

// ArtifactWanted is WantsArtifact with the source the live prefetch names,
// the form the artifact credential service takes.
func (s *Service) ArtifactWanted(nodeID, digest string) (schemas.ArtifactSource, bool) {
	if !s.WantsArtifact(nodeID, digest) {
		return schemas.ArtifactSource{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.records {
		if a := r.p.Artifact; a != nil && a.Digest == digest {
			return a.Source, true
		}
	}
	return schemas.ArtifactSource{}, false
}

func (s *Service) wants(k wantKey) bool {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, deadline := range s.wanted[k] {
		if now.Before(deadline) {
			return true
		}
	}
	return false
}

// DiskKeep lists the images and artifacts with a live prefetch on the
// node: its disk collection keeps them (nodes.DiskKeeper).
func (s *Service) DiskKeep(nodeID string) []schemas.DiskItem {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []schemas.DiskItem
	for k, deadlines := range s.wanted {
		if k.node != nodeID {
			continue
		}
		for _, d := range deadlines {
			if !now.Before(d) {
				continue
			}
			item := schemas.DiskItem{Kind: schemas.DiskItemImage, ID: k.image.Digest, Reason: "an operator's prefetch wants it here"}
			if k.artifact != "" {
				item.Kind, item.ID = schemas.DiskItemArtifact, k.artifact
			}
			out = append(out, item)
			break
		}
	}
	return out
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

// handleRequest answers wf.admin.prefetch: validate, choose the nodes,
// record the prefetch, send each node its PrepareImage (or
// PrepareArtifact), reply the record.
// A request sent again (same request id) is answered with the record it
// made, and its commands not yet answered are sent again (the nodes apply
// each once).
func (s *Service) handleRequest(ctx context.Context, m *nats.Msg) {
	var req schemas.PrefetchRequest
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = req.Validate()
	}
	var sel Selector
	if err == nil {
		sel, err = ParseSelector(req.Nodes)
	}
	if err != nil {
		s.reply(m, enc, schemas.Reply[schemas.Prefetch]{Refusal: schemas.RefusalOfInput(err, "body is not a PrefetchRequest")})
		return
	}
	id := schemas.PrefetchIDFor(req.RequestID)
	p, err := s.create(ctx, id, req, sel)
	if err != nil {
		s.reply(m, enc, schemas.Reply[schemas.Prefetch]{Refusal: schemas.AsRefusal(err)})
		return
	}
	p = s.send(ctx, p)
	s.reply(m, enc, schemas.Reply[schemas.Prefetch]{OK: &p})
}

// content is what a new prefetch warms: the request's image, or its
// artifact as the catalog resolves it now.
func (s *Service) content(ctx context.Context, req schemas.PrefetchRequest) (schemas.Prefetch, error) {
	if req.Artifact == "" {
		ref, _ := schemas.ParseImageRef("image", req.Image) // Validate parsed it
		return schemas.Prefetch{Image: ref.String(), ManifestDigest: ref.Digest}, nil
	}
	if s.artifacts == nil {
		return schemas.Prefetch{}, &schemas.Refusal{Code: schemas.CodeArtifactUnknown, Field: "artifact",
			Reason: "this control plane has no artifact catalog, so it prefetches no artifact; prefetch an image instead"}
	}
	use, _ := schemas.ParseArtifactRef("artifact", req.Artifact) // Validate parsed it
	ms, err := s.artifacts.Resolve(ctx, []schemas.ArtifactUse{use})
	var r *schemas.Refusal
	switch {
	case errors.As(err, &r):
		// The catalog names the field of a Run's use; here it is ours.
		return schemas.Prefetch{}, &schemas.Refusal{Code: r.Code, Field: "artifact", Reason: r.Reason}
	case err != nil:
		return schemas.Prefetch{}, fmt.Errorf("prefetch of artifact %s: resolve: %w", use.Ref(), err)
	case len(ms) != 1:
		return schemas.Prefetch{}, fmt.Errorf("prefetch of artifact %s: the catalog answered %d artifacts for one", use.Ref(), len(ms))
	}
	m := ms[0]
	m.Path = "/prefetch" // a mount's rule wants a path; a prefetch mounts nothing
	if err := m.Validate("artifact"); err != nil {
		return schemas.Prefetch{}, fmt.Errorf("prefetch of artifact %s: the catalog answered an invalid record: %w", use.Ref(), err)
	}
	return schemas.Prefetch{Artifact: schemas.PrefetchArtifactOf(m)}, nil
}

// create stores a new prefetch record, or returns the one its request id
// already made.
func (s *Service) create(ctx context.Context, id string, req schemas.PrefetchRequest, sel Selector) (schemas.Prefetch, error) {
	if p, err := s.existing(ctx, id, req); err == nil || !errors.Is(err, jetstream.ErrKeyNotFound) {
		return p, err
	}
	p, err := s.content(ctx, req)
	if err != nil {
		return p, err
	}
	now := s.now()
	choose, what, noun := Choose, "the image hot", "node"
	if p.Artifact != nil {
		choose, what, noun = ChooseArtifact, "a replica of the artifact", "node that declares an artifact replica store"
	}
	plan, err := choose(s.cache.Nodes(), now, sel, req.Count, p.ContentDigest())
	if err != nil {
		return schemas.Prefetch{}, err
	}
	if len(plan.Targets) == 0 {
		why := "no live " + noun + " matches; `warmfleet node list` shows each node's state"
		if len(plan.Hot) > 0 {
			why = fmt.Sprintf("every matching live node (%d) already holds %s", len(plan.Hot), what)
		}
		return schemas.Prefetch{}, &schemas.Refusal{Code: schemas.CodeNoPrefetchTarget, Field: "nodes", Reason: why}
	}
	if len(plan.Targets)+len(plan.Skipped) > schemas.MaxPrefetchNodes {
		return schemas.Prefetch{}, &schemas.Refusal{Code: schemas.CodeTooManyItems, Field: "nodes",
			Reason: fmt.Sprintf("%d nodes match; one prefetch takes at most %d: narrow the selector or use --count", len(plan.Targets)+len(plan.Skipped), schemas.MaxPrefetchNodes)}
	}
	p.ID, p.RequestID, p.Selector, p.Count, p.CreatedAt, p.ExpiresAt = id, req.RequestID, sel.String(), req.Count, now, now.Add(req.Timeout())
	for _, n := range plan.Targets {
		p.Nodes = append(p.Nodes, schemas.PrefetchNode{NodeID: n, State: schemas.PrefetchSent, OperationID: OpID(id, n), UpdatedAt: now})
	}
	p.Nodes = append(p.Nodes, plan.Skipped...)
	raw, rev, err := bus.CreateJSONRaw(ctx, s.kv, id, p)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return s.existing(ctx, id, req) // another replica made it meanwhile
	}
	if err != nil {
		return schemas.Prefetch{}, fmt.Errorf("prefetch %s: store: %w", id, err)
	}
	s.note(p, rev, raw)
	s.log.Info("prefetch recorded", zap.String("prefetch_id", id), zap.String("content", p.Content()),
		zap.Int("nodes", len(plan.Targets)), zap.Int("skipped", len(plan.Skipped)))
	return p, nil
}

// existing reads a stored prefetch for a request sent again; another
// image or artifact under the same request id is refused. An artifact is
// matched as the request names it (not resolved again), so a request
// sent again answers the same record after the catalog gained a version.
func (s *Service) existing(ctx context.Context, id string, req schemas.PrefetchRequest) (schemas.Prefetch, error) {
	var p schemas.Prefetch
	if _, err := bus.GetJSON(ctx, s.kv, id, &p); err != nil {
		return p, err
	}
	same := false
	if req.Artifact == "" {
		ref, _ := schemas.ParseImageRef("image", req.Image)
		same = p.Artifact == nil && ref.Digest == p.ManifestDigest
	} else if a := p.Artifact; a != nil {
		u, _ := schemas.ParseArtifactRef("artifact", req.Artifact)
		same = u.Name == a.Name && (u.Version == "" || u.Version == a.Version) && (u.Digest == "" || u.Digest == a.Digest)
	}
	if !same {
		return p, &schemas.Refusal{Code: schemas.CodeRequestIDConflict, Field: "request_id",
			Reason: "this request id already named a prefetch of another image or artifact; use a new request id"}
	}
	return p, nil
}

// sendOne sends a prefetch's command to one node.
func (s *Service) sendOne(ctx context.Context, p schemas.Prefetch, nodeID, opID string) error {
	if p.Artifact != nil {
		return s.dispatch.PrefetchArtifact(ctx, nodeID, opID, p.ID, p.Artifact.Mount())
	}
	ref, err := schemas.ParseImageRef("image", p.Image)
	if err != nil {
		return fmt.Errorf("prefetch %s: stored image: %w", p.ID, err)
	}
	return s.dispatch.Prefetch(ctx, nodeID, opID, p.ID, ref)
}

// send sends the command of every entry still waiting for its node. A
// node the command cannot reach has its entry failed.
func (s *Service) send(ctx context.Context, p schemas.Prefetch) schemas.Prefetch {
	if p.TimedOut(s.now()) {
		return p
	}
	for _, n := range p.Nodes {
		if n.State.Finished() {
			continue
		}
		err := s.sendOne(ctx, p, n.NodeID, n.OperationID)
		if err == nil {
			continue
		}
		s.log.Warn("prefetch command not sent", zap.String("prefetch_id", p.ID), zap.String("node_id", n.NodeID), zap.Error(err))
		if q, uerr := s.finish(ctx, p.ID, n.NodeID, n.OperationID, schemas.PrefetchFailed, schemas.CodeInternal, "the control plane could not send the command: "+err.Error()); uerr == nil {
			p = q
		}
	}
	return p
}

func (s *Service) reply(m *nats.Msg, enc codec.Encoding, v any) {
	if err := bus.Respond(m, enc, v); err != nil {
		s.log.Error("reply", zap.String("subject", m.Subject), zap.Error(err))
	}
}

// update applies mutate to a prefetch record by CAS, seeded from this
// replica's copy, and notes the result.
func (s *Service) update(ctx context.Context, id string, mutate func(*schemas.Prefetch) error) (schemas.Prefetch, error) {
	p, rev, raw, err := bus.UpdateJSONFrom(ctx, s.kv, id, s.seed(id), mutate)
	if err != nil {
		return p, err
	}
	s.note(p, rev, raw)
	return p, nil
}

// finish moves one node's entry to a finished state, once.
func (s *Service) finish(ctx context.Context, id, nodeID, opID string, state schemas.PrefetchState, code schemas.Code, reason string) (schemas.Prefetch, error) {
	return s.update(ctx, id, func(p *schemas.Prefetch) error { return s.finishEntry(p, nodeID, opID, state, code, reason) })
}

func (s *Service) finishEntry(p *schemas.Prefetch, nodeID, opID string, state schemas.PrefetchState, code schemas.Code, reason string) error {
	n := p.Node(nodeID)
	if n == nil || n.OperationID != opID || n.State.Finished() {
		return bus.ErrNoChange
	}
	n.State, n.Code, n.Reason, n.UpdatedAt = state, code, reason, s.now()
	if state == schemas.PrefetchReady && n.Progress != nil && n.Progress.TotalBytes > 0 {
		n.Progress.DoneBytes = n.Progress.TotalBytes
	}
	return nil
}

// kindOf is the command a prefetch sends its nodes.
func kindOf(p schemas.Prefetch) schemas.CommandKind {
	if p.Artifact != nil {
		return schemas.CmdPrepareArtifact
	}
	return schemas.CmdPrepareImage
}

// Receipt applies a node's answer to a prefetch's PrepareImage or
// PrepareArtifact (the record's own kind; another is ignored): applied
// makes its entry ready, failed or refused makes it failed with the node's
// code and message. A command refused for a superseded session is sent
// again under the node's current one. A receipt for a record gone, or an
// entry already finished, changes nothing.
func (s *Service) Receipt(ctx context.Context, nodeID string, rc schemas.OperationReceipt) error {
	if rc.Outcome == schemas.OutcomeRefused && (rc.Code == schemas.CodeStaleFencingToken || rc.Code == schemas.CodeStaleGeneration) {
		p, ok := s.Get(rc.PrefetchID)
		if !ok || p.TimedOut(s.now()) || rc.Kind != kindOf(p) {
			return nil
		}
		return s.sendOne(ctx, p, nodeID, rc.OperationID)
	}
	state, code, reason := schemas.PrefetchReady, schemas.Code(""), ""
	if rc.Outcome != schemas.OutcomeApplied {
		state, code, reason = schemas.PrefetchFailed, rc.Code, strings.TrimSpace(rc.Outcome+": "+rc.Message)
		if code == "" {
			code = schemas.CodeLaunchFailed
			if rc.Kind == schemas.CmdPrepareArtifact {
				code = schemas.CodeArtifactFetchFailed
			}
		}
	}
	_, err := s.update(ctx, rc.PrefetchID, func(p *schemas.Prefetch) error {
		if rc.Kind != kindOf(*p) {
			return bus.ErrNoChange
		}
		return s.finishEntry(p, nodeID, rc.OperationID, state, code, reason)
	})
	switch {
	case err == nil:
		s.log.Info("prefetch entry finished", zap.String("prefetch_id", rc.PrefetchID), zap.String("node_id", nodeID), zap.String("state", string(state)))
		return nil
	case errors.Is(err, bus.ErrNoChange), errors.Is(err, jetstream.ErrKeyNotFound):
		return nil
	}
	return err
}

// Progress takes a node's report of a prefetch's transfer. It is held in
// memory and written with the record's next flush: progress is a view, and
// a report lost with a replica is replaced by the node's next one.
func (s *Service) Progress(nodeID string, p schemas.ImageProgress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	byNode := s.pending[p.PrefetchID]
	if byNode == nil {
		byNode = map[string]schemas.ImageProgress{}
		s.pending[p.PrefetchID] = byNode
	}
	if old, ok := byNode[nodeID]; !ok || p.Progress.DoneBytes >= old.Progress.DoneBytes {
		byNode[nodeID] = p
	}
}

// pruneEvery is how often the copy drops prefetches past their deadline:
// the bucket's age limit removes records without a mark the watch sees,
// and a timed-out prefetch wants nothing and takes no more reports.
const pruneEvery = time.Minute

func (s *Service) flushLoop(ctx context.Context) {
	t := time.NewTicker(s.flush)
	defer t.Stop()
	pruned := s.now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if now := s.now(); now.Sub(pruned) >= pruneEvery {
			s.prune(now)
			pruned = now
		}
		s.mu.Lock()
		pending := s.pending
		s.pending = map[string]map[string]schemas.ImageProgress{}
		s.mu.Unlock()
		for id, byNode := range pending {
			if err := s.writeProgress(ctx, id, byNode); err != nil && ctx.Err() == nil {
				s.log.Warn("prefetch progress not written; the next report will be", zap.String("prefetch_id", id), zap.Error(err))
			}
		}
	}
}

// prune drops timed-out prefetches from this replica's copy.
func (s *Service) prune(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, m := range s.records {
		if m.p.TimedOut(now) {
			s.unindexLocked(m.p)
			delete(s.records, id)
		}
	}
}

// writeProgress writes one record's pending progress in one CAS: an
// unfinished entry becomes pulling with the larger count.
func (s *Service) writeProgress(ctx context.Context, id string, byNode map[string]schemas.ImageProgress) error {
	_, err := s.update(ctx, id, func(p *schemas.Prefetch) error {
		changed := false
		for nodeID, ip := range byNode {
			n, tp := p.Node(nodeID), ip.Progress
			if n == nil || n.OperationID != ip.OperationID || n.State.Finished() ||
				(n.Progress != nil && tp.DoneBytes <= n.Progress.DoneBytes && tp.TotalBytes == n.Progress.TotalBytes) {
				continue
			}
			n.State, n.Progress, n.UpdatedAt, changed = schemas.PrefetchPulling, &tp, s.now(), true
		}
		if !changed {
			return bus.ErrNoChange
		}
		return nil
	})
	if errors.Is(err, bus.ErrNoChange) || errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return err
}
