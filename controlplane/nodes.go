package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// serveNodes answers enrollments, renewals and invitations and takes
// heartbeats. All are core NATS (not streams): a lost heartbeat is replaced
// by the next one, and a request is retried by its sender. The queue group
// spreads them over replicas.
func (cp *ControlPlane) serveNodes(ctx context.Context) (func(), error) {
	enroll, err := cp.conn.NC.QueueSubscribe(bus.SubjectEnroll, "warmfleet-cp", func(m *nats.Msg) { cp.handleEnroll(ctx, m) })
	if err != nil {
		return nil, fmt.Errorf("controlplane: subscribe %s: %w", bus.SubjectEnroll, err)
	}
	subs := []*nats.Subscription{enroll}
	stop := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	for subj, h := range map[string]nats.MsgHandler{
		bus.SubjectHeartbeats: func(m *nats.Msg) { cp.handleHeartbeat(ctx, m) },
		bus.SubjectRenewals:   func(m *nats.Msg) { cp.handleRenew(ctx, m) },
		bus.SubjectInvite:     func(m *nats.Msg) { cp.handleInvite(ctx, m) },
		bus.SubjectDrain:      func(m *nats.Msg) { cp.handleDrain(ctx, m) },
		bus.SubjectRetire:     func(m *nats.Msg) { cp.handleRetire(ctx, m) },
	} {
		s, err := cp.conn.NC.QueueSubscribe(subj, "warmfleet-cp", h)
		if err != nil {
			stop()
			return nil, fmt.Errorf("controlplane: subscribe %s: %w", subj, err)
		}
		subs = append(subs, s)
	}
	return stop, nil
}

// handleHeartbeat extends a node's lease. A heartbeat under an old fencing
// token is dropped: only the current session keeps a node alive.
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
	rec, rev, err := bus.UpdateJSON(ctx, cp.nodesKV, hb.NodeID, func(n *schemas.NodeRecord) error {
		if n.FencingToken != hb.FencingToken {
			return errFenced
		}
		if n.State == schemas.NodeLost {
			n.State = schemas.NodeReady
		}
		n.LeaseExpires = now.Add(cp.leaseTTL())
		return nil
	})
	switch {
	case errors.Is(err, errFenced):
		cp.metrics.fencedObs.Add(1)
		cp.log.Info("heartbeat from superseded session dropped", zap.String("node_id", hb.NodeID), zap.Uint64("token", hb.FencingToken))
	case err != nil:
		cp.log.Debug("heartbeat not recorded", zap.String("node_id", hb.NodeID), zap.Error(err))
	default:
		cp.cache.applyNodeRecord(rec, rev)
	}
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
