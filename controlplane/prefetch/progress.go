package prefetch

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

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
		// Only an entry of this node's, under the operation it was sent,
		// is sent again: a receipt cannot draw another node's prefetch.
		if n := p.Node(nodeID); n == nil || n.OperationID != rc.OperationID || n.State.Finished() {
			return nil
		}
		return s.sendOne(ctx, p, nodeID, rc.OperationID)
	}
	state, code, reason := schemas.PrefetchReady, schemas.Code(""), ""
	if rc.Outcome != schemas.OutcomeApplied {
		state, code, reason = schemas.PrefetchFailed, rc.Code, strings.TrimSpace(rc.Outcome+": "+schemas.TruncateText(rc.Message, schemas.MaxReceiptMessageBytes))
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
