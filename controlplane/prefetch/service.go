// Package prefetch is the control plane's prefetches: an operator's request
// to warm an image on nodes before Runs need it (wf.admin.prefetch), the
// node selector and the choice of nodes, the record of each node's progress
// in wf_prefetch, the PrepareImage commands, and what nodes report back.
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

	mu sync.Mutex
	// records is this replica's copy of wf_prefetch, with the stored bytes
	// to seed the next CAS.
	records map[string]mirrored
	// wanted counts, per node and manifest digest, the live prefetches
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

type wantKey struct {
	node  string
	image schemas.ImageRef
}

// New returns the prefetch service over wf_prefetch (kv). flush is
// DefaultFlushInterval when zero.
func New(kv jetstream.KeyValue, nc *nats.Conn, c *cache.Cache, d *dispatch.Dispatcher, flush time.Duration, now func() time.Time, log *zap.Logger) *Service {
	if flush <= 0 {
		flush = DefaultFlushInterval
	}
	return &Service{kv: kv, nc: nc, cache: c, dispatch: d, now: now, flush: flush, log: log,
		records: map[string]mirrored{}, wanted: map[wantKey]map[string]time.Time{}, pending: map[string]map[string]schemas.ImageProgress{}}
}

// OpID is the operation id of a prefetch's PrepareImage on one node: the
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
		k := wantKey{n.NodeID, imageOf(p)}
		if s.wanted[k] == nil {
			s.wanted[k] = map[string]time.Time{}
		}
		s.wanted[k][p.ID] = p.ExpiresAt
	}
}

func (s *Service) unindexLocked(p schemas.Prefetch) {
	for _, n := range p.Nodes {
		k := wantKey{n.NodeID, imageOf(p)}
		delete(s.wanted[k], p.ID)
		if len(s.wanted[k]) == 0 {
			delete(s.wanted, k)
		}
	}
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
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, deadline := range s.wanted[wantKey{nodeID, ref}] {
		if now.Before(deadline) {
			return true
		}
	}
	return false
}

// DiskKeep lists the images with a live prefetch on the node: its disk
// collection keeps them (nodes.DiskKeeper).
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
			if now.Before(d) {
				out = append(out, schemas.DiskItem{Kind: schemas.DiskItemImage, ID: k.image.Digest, Reason: "an operator's prefetch wants it here"})
				break
			}
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
// record the prefetch, send each node its PrepareImage, reply the record.
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
	ref, _ := schemas.ParseImageRef("image", req.Image) // Validate parsed it
	id := schemas.PrefetchIDFor(req.RequestID)
	p, err := s.create(ctx, id, req, sel, ref)
	if err != nil {
		s.reply(m, enc, schemas.Reply[schemas.Prefetch]{Refusal: schemas.AsRefusal(err)})
		return
	}
	p = s.send(ctx, p, ref)
	s.reply(m, enc, schemas.Reply[schemas.Prefetch]{OK: &p})
}

// create stores a new prefetch record, or returns the one its request id
// already made.
func (s *Service) create(ctx context.Context, id string, req schemas.PrefetchRequest, sel Selector, ref schemas.ImageRef) (schemas.Prefetch, error) {
	if p, err := s.existing(ctx, id, req); err == nil || !errors.Is(err, jetstream.ErrKeyNotFound) {
		return p, err
	}
	now := s.now()
	plan, err := Choose(s.cache.Nodes(), now, sel, req.Count, ref.Digest)
	if err != nil {
		return schemas.Prefetch{}, err
	}
	if len(plan.Targets) == 0 {
		why := "no live node matches; `warmfleet node list` shows each node's state"
		if len(plan.Hot) > 0 {
			why = fmt.Sprintf("every matching live node (%d) already holds the image hot", len(plan.Hot))
		}
		return schemas.Prefetch{}, &schemas.Refusal{Code: schemas.CodeNoPrefetchTarget, Field: "nodes", Reason: why}
	}
	if len(plan.Targets)+len(plan.Skipped) > schemas.MaxPrefetchNodes {
		return schemas.Prefetch{}, &schemas.Refusal{Code: schemas.CodeTooManyItems, Field: "nodes",
			Reason: fmt.Sprintf("%d nodes match; one prefetch takes at most %d: narrow the selector or use --count", len(plan.Targets)+len(plan.Skipped), schemas.MaxPrefetchNodes)}
	}
	p := schemas.Prefetch{ID: id, RequestID: req.RequestID, Image: ref.String(), ManifestDigest: ref.Digest,
		Selector: sel.String(), Count: req.Count, CreatedAt: now, ExpiresAt: now.Add(req.Timeout())}
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
	s.log.Info("prefetch recorded", zap.String("prefetch_id", id), zap.String("image", p.Image),
		zap.Int("nodes", len(plan.Targets)), zap.Int("skipped", len(plan.Skipped)))
	return p, nil
}

// existing reads a stored prefetch for a request sent again; another
// image under the same request id is refused.
func (s *Service) existing(ctx context.Context, id string, req schemas.PrefetchRequest) (schemas.Prefetch, error) {
	var p schemas.Prefetch
	if _, err := bus.GetJSON(ctx, s.kv, id, &p); err != nil {
		return p, err
	}
	if ref, _ := schemas.ParseImageRef("image", req.Image); ref.Digest != p.ManifestDigest {
		return p, &schemas.Refusal{Code: schemas.CodeRequestIDConflict, Field: "request_id",
			Reason: "this request id already named a prefetch of another image; use a new request id"}
	}
	return p, nil
}

// send sends the PrepareImage of every entry still waiting for its
// node. A node the command cannot reach has its entry failed.
func (s *Service) send(ctx context.Context, p schemas.Prefetch, ref schemas.ImageRef) schemas.Prefetch {
	if p.TimedOut(s.now()) {
		return p
	}
	for _, n := range p.Nodes {
		if n.State.Finished() {
			continue
		}
		err := s.dispatch.Prefetch(ctx, n.NodeID, n.OperationID, p.ID, ref)
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
	return s.update(ctx, id, func(p *schemas.Prefetch) error {
		n := p.Node(nodeID)
		if n == nil || n.OperationID != opID || n.State.Finished() {
			return bus.ErrNoChange
		}
		n.State, n.Code, n.Reason, n.UpdatedAt = state, code, reason, s.now()
		if state == schemas.PrefetchReady && n.Progress != nil && n.Progress.TotalBytes > 0 {
			n.Progress.DoneBytes = n.Progress.TotalBytes
		}
		return nil
	})
}

// Receipt applies a node's answer to a prefetch's PrepareImage: applied
// makes its entry ready, failed or refused makes it failed with the node's
// code and message. A command refused for a superseded session is sent
// again under the node's current one. A receipt for a record gone, or an
// entry already finished, changes nothing.
func (s *Service) Receipt(ctx context.Context, nodeID string, rc schemas.OperationReceipt) error {
	if rc.Outcome == schemas.OutcomeRefused && (rc.Code == schemas.CodeStaleFencingToken || rc.Code == schemas.CodeStaleGeneration) {
		p, ok := s.Get(rc.PrefetchID)
		if !ok || p.TimedOut(s.now()) {
			return nil
		}
		ref, err := schemas.ParseImageRef("image", p.Image)
		if err != nil {
			return nil
		}
		return s.dispatch.Prefetch(ctx, nodeID, rc.OperationID, rc.PrefetchID, ref)
	}
	state, code, reason := schemas.PrefetchReady, schemas.Code(""), ""
	if rc.Outcome != schemas.OutcomeApplied {
		state, code, reason = schemas.PrefetchFailed, rc.Code, strings.TrimSpace(rc.Outcome+": "+rc.Message)
		if code == "" {
			code = schemas.CodeLaunchFailed
		}
	}
	_, err := s.finish(ctx, rc.PrefetchID, nodeID, rc.OperationID, state, code, reason)
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
