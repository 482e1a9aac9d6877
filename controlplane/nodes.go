package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/schemas"
)

// enrollWorkers bounds how many enrollments one replica handles at once.
// Each is a few KV and JetStream API round trips; enrollments of one node
// are ordered by the per-node lock in enroll.
const enrollWorkers = 32

// serveNodes answers enrollments, renewals and invitations and takes
// heartbeats. All are core NATS (not streams): a lost heartbeat is replaced
// by the next one, and a request is retried by its sender. The queue group
// spreads requests over replicas; heartbeats are taken by every replica
// (no queue group), so each one's in-memory lease table is complete.
// Enrollments are handed to a pool of workers that wg owns and ctx stops.
func (cp *ControlPlane) serveNodes(ctx context.Context, wg *sync.WaitGroup) (func(), error) {
	enrollPool := keyed.NewPool(ctx, wg, keyed.PoolOptions{Workers: enrollWorkers, Queue: enrollWorkers * 4}, cp.handleEnroll)
	enroll, err := cp.conn.NC.QueueSubscribe(bus.SubjectEnroll, "warmfleet-cp", func(m *nats.Msg) {
		// Keyed by the reply inbox only to spread the load: the per-node
		// lock in enroll orders one node's enrollments.
		enrollPool.Submit(m.Reply, m)
	})
	if err != nil {
		return nil, fmt.Errorf("controlplane: subscribe %s: %w", bus.SubjectEnroll, err)
	}
	subs := []*nats.Subscription{enroll}
	stop := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	hb, err := cp.conn.NC.Subscribe(bus.SubjectHeartbeats, func(m *nats.Msg) { cp.handleHeartbeat(ctx, m) })
	if err != nil {
		stop()
		return nil, fmt.Errorf("controlplane: subscribe %s: %w", bus.SubjectHeartbeats, err)
	}
	subs = append(subs, hb)
	if err := cp.queueSubscribeAll(&subs, map[string]nats.MsgHandler{
		bus.SubjectRenewals:   func(m *nats.Msg) { cp.handleRenew(ctx, m) },
		bus.SubjectInvite:     func(m *nats.Msg) { cp.handleInvite(ctx, m) },
		bus.SubjectDrain:      func(m *nats.Msg) { cp.handleDrain(ctx, m) },
		bus.SubjectRetire:     func(m *nats.Msg) { cp.handleRetire(ctx, m) },
		bus.SubjectNodeLeases: func(m *nats.Msg) { cp.handleNodeLeases(m) },
	}); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// queueSubscribeAll subscribes each handler in the replicas' shared queue
// group, appending to subs as it goes so the caller's stop also ends the
// subscriptions made before a failure.
func (cp *ControlPlane) queueSubscribeAll(subs *[]*nats.Subscription, handlers map[string]nats.MsgHandler) error {
	for subj, h := range handlers {
		s, err := cp.conn.NC.QueueSubscribe(subj, "warmfleet-cp", h)
		if err != nil {
			return fmt.Errorf("controlplane: subscribe %s: %w", subj, err)
		}
		*subs = append(*subs, s)
	}
	return nil
}

// handleHeartbeat extends a node's lease. A heartbeat under an old fencing
// token is dropped: only the current session keeps a node alive.
//
// The lease is extended in memory when the cached record vouches for the
// session: no KV read or write. wf_nodes is written only when the heartbeat
// changes the node's state (lost → ready), by CAS as before; the cache
// sends a heartbeat to the store only when it cannot decide.
func (cp *ControlPlane) handleHeartbeat(ctx context.Context, m *nats.Msg) {
	var hb schemas.Heartbeat
	if _, err := codec.DecodeMsg(m, &hb); err != nil {
		cp.log.Debug("malformed heartbeat dropped", zap.String("subject", m.Subject), zap.Error(err))
		return
	}
	if subjectNode(m.Subject) != hb.NodeID {
		cp.metrics.fencedObs.Add(1)
		return
	}
	now := cp.now()
	until := now.Add(cp.leaseTTL())
	switch cp.cache.heartbeat(hb.NodeID, hb.FencingToken, until) {
	case heartbeatExtended:
		cp.metrics.heartbeats.Add(1)
		return
	case heartbeatFenced:
		cp.fencedHeartbeat(hb)
		return
	}
	rec, rev, err := bus.UpdateJSON(ctx, cp.nodesKV, hb.NodeID, func(n *schemas.NodeRecord) error {
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
		cp.fencedHeartbeat(hb)
	case err != nil && !errors.Is(err, bus.ErrNoChange):
		cp.log.Debug("heartbeat not recorded", zap.String("node_id", hb.NodeID), zap.Error(err))
	default:
		if err == nil {
			cp.log.Info("lost node heartbeating again", zap.String("node_id", hb.NodeID), zap.Uint64("fencing_token", hb.FencingToken))
		}
		cp.cache.applyNodeRecord(rec, rev)
		cp.cache.extendLease(hb.NodeID, hb.FencingToken, until)
		cp.metrics.heartbeats.Add(1)
	}
}

func (cp *ControlPlane) fencedHeartbeat(hb schemas.Heartbeat) {
	cp.metrics.fencedObs.Add(1)
	cp.log.Info("heartbeat from superseded session dropped", zap.String("node_id", hb.NodeID), zap.Uint64("token", hb.FencingToken))
}

var errFenced = errors.New("superseded fencing token")

// subjectNode extracts <id> from wf.node.<id>.<verb>.
func subjectNode(subject string) string {
	parts := strings.Split(subject, ".")
	if len(parts) != 4 {
		return ""
	}
	return parts[2]
}

func (cp *ControlPlane) reply(m *nats.Msg, enc codec.Encoding, v any) {
	if m.Reply == "" {
		return
	}
	b, err := codec.Encode(enc, v)
	if err != nil {
		cp.log.Error("encode reply", zap.Error(err))
		return
	}
	out := &nats.Msg{Subject: m.Reply, Data: b, Header: nats.Header{}}
	out.Header.Set(codec.ContentTypeHeader, enc.ContentType())
	_ = m.RespondMsg(out)
}
