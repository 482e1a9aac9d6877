package nodes

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/schemas"
	"go.uber.org/zap"
)

// handleHeartbeat extends a node's lease. A heartbeat under an old fencing
// token is dropped: only the current session keeps a node alive.
//
// The lease is extended in memory when the cached record vouches for the
// session: no KV read or write. wf_nodes is written only when the heartbeat
// changes the node's state (lost → ready), by CAS as before; the cache
// sends a heartbeat to the store only when it cannot decide.
func (s *Service) handleHeartbeat(ctx context.Context, m *nats.Msg) {
	var hb schemas.Heartbeat
	if err := decodeHeartbeat(m, &hb); err != nil {
		s.log.Debug("malformed heartbeat dropped", zap.String("subject", m.Subject), zap.Error(err))
		return
	}
	if bus.SubjectNode(m.Subject) != hb.NodeID {
		s.fenced.Add(1)
		return
	}
	now := s.cfg.Now()
	until := now.Add(s.LeaseTTL())
	if hb.Interruption != nil {
		s.noteInterruption(ctx, hb)
	}
	switch s.cache.Heartbeat(hb.NodeID, hb.FencingToken, until) {
	case cache.HeartbeatExtended:
		s.heartbeats.Add(1)
		return
	case cache.HeartbeatFenced:
		s.fencedHeartbeat(hb)
		return
	}
	rec, rev, err := bus.UpdateJSON(ctx, s.nodesKV, hb.NodeID, func(n *schemas.NodeRecord) error {
		if n.FencingToken != hb.FencingToken {
			return errFenced
		}
		if n.State != schemas.NodeLost {
			return bus.ErrNoChange // live: the in-memory lease is enough
		}
		n.State = schemas.NodeReady
		n.LeaseExpires = until
		return nil
	})
	switch {
	case errors.Is(err, errFenced):
		s.fencedHeartbeat(hb)
	case err != nil && !errors.Is(err, bus.ErrNoChange):
		s.log.Debug("heartbeat not recorded", zap.String("node_id", hb.NodeID), zap.Error(err))
	default:
		if err == nil {
			s.log.Info("lost node heartbeating again", zap.String("node_id", hb.NodeID), zap.Uint64("fencing_token", hb.FencingToken))
		}
		s.cache.NoteNode(rec, rev)
		s.cache.ExtendLease(hb.NodeID, hb.FencingToken, until)
		s.heartbeats.Add(1)
	}
}

// noteInterruption records, once, a node's report that its provider is
// taking the machine back: placement books nothing more there, and the
// rental manager ends its rental as interrupted.
func (s *Service) noteInterruption(ctx context.Context, hb schemas.Heartbeat) {
	if n, ok := s.cache.Node(hb.NodeID); ok && n.Interruption != nil {
		return
	}
	rec, rev, err := bus.UpdateJSON(ctx, s.nodesKV, hb.NodeID, func(n *schemas.NodeRecord) error {
		if n.FencingToken != hb.FencingToken {
			return errFenced
		}
		if n.Interruption != nil {
			return bus.ErrNoChange
		}
		n.Interruption = hb.Interruption
		return nil
	})
	if err != nil {
		if !errors.Is(err, bus.ErrNoChange) {
			s.log.Debug("interruption notice not recorded", zap.String("node_id", hb.NodeID), zap.Error(err))
		}
		return
	}
	s.log.Warn("node reports its provider is taking it back", zap.String("node_id", hb.NodeID),
		zap.String("source", hb.Interruption.Source), zap.Time("at", hb.Interruption.At))
	s.cache.NoteNode(rec, rev)
}

func (s *Service) fencedHeartbeat(hb schemas.Heartbeat) {
	s.fenced.Add(1)
	s.log.Info("heartbeat from superseded session dropped", zap.String("node_id", hb.NodeID), zap.Uint64("token", hb.FencingToken))
}

var errFenced = errors.New("superseded fencing token")

// decodeHeartbeat decodes and checks one heartbeat: the size limit before
// decoding, strictly, then its Validate.
func decodeHeartbeat(m *nats.Msg, hb *schemas.Heartbeat) error {
	return schemas.DecodeNodeMessage(codec.Detect(m.Header, m.Data), m.Data, hb)
}

// renewalServer serves session renewals with answer: a body is decoded
// strictly and bounded (SessionRenewal.Validate) before answer sees it.
func renewalServer(answer func(context.Context, string, schemas.SessionRenewal) (schemas.SessionRenewal, error), log *zap.Logger) *requests.Server[schemas.SessionRenewal, schemas.Reply[schemas.SessionRenewal]] {
	return requests.Coded(bus.SubjectRenewals, "body is not a SessionRenewal", (*schemas.SessionRenewal).Validate, answer, log)
}
