package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// serveNodes answers enrollments and takes heartbeats. Both are core NATS
// (not streams): a lost heartbeat is replaced by the next one, and an
// enrollment is retried by the agent. The queue group spreads them over
// replicas.
func (cp *ControlPlane) serveNodes(ctx context.Context) (func(), error) {
	enroll, err := cp.conn.NC.QueueSubscribe(bus.SubjectEnroll, "warmfleet-cp", func(m *nats.Msg) { cp.handleEnroll(ctx, m) })
	if err != nil {
		return nil, fmt.Errorf("controlplane: subscribe %s: %w", bus.SubjectEnroll, err)
	}
	hb, err := cp.conn.NC.QueueSubscribe(bus.SubjectHeartbeats, "warmfleet-cp", func(m *nats.Msg) { cp.handleHeartbeat(ctx, m) })
	if err != nil {
		_ = enroll.Unsubscribe()
		return nil, fmt.Errorf("controlplane: subscribe %s: %w", bus.SubjectHeartbeats, err)
	}
	return func() { _ = enroll.Unsubscribe(); _ = hb.Unsubscribe() }, nil
}

// handleEnroll registers a node: it raises the node's fencing token by CAS,
// mints a session token (only its hash is stored), creates the node's
// command consumer and answers in the request's encoding.
func (cp *ControlPlane) handleEnroll(ctx context.Context, m *nats.Msg) {
	var req schemas.EnrollmentRequest
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		ref := schemas.AsRefusal(err)
		if errors.Is(err, codec.ErrMalformed) {
			ref = &schemas.Refusal{Code: schemas.CodeMalformed, Reason: "body is not an EnrollmentRequest"}
		}
		cp.reply(m, enc, schemas.Reply[schemas.Enrollment]{Refusal: ref})
		return
	}
	enr, err := cp.enroll(ctx, req)
	if err != nil {
		cp.log.Warn("enrollment failed", zap.String("node_id", req.NodeID), zap.Error(err))
		cp.reply(m, enc, schemas.Reply[schemas.Enrollment]{Refusal: schemas.AsRefusal(err)})
		return
	}
	cp.log.Info("node enrolled", zap.String("node_id", enr.NodeID), zap.Uint64("fencing_token", enr.FencingToken), zap.Bool("duplicate", enr.Duplicate))
	cp.reply(m, enc, schemas.Reply[schemas.Enrollment]{OK: &enr})
}

func (cp *ControlPlane) enroll(ctx context.Context, req schemas.EnrollmentRequest) (schemas.Enrollment, error) {
	cp.enrollMu.Lock()
	defer cp.enrollMu.Unlock()
	token, err := newToken()
	if err != nil {
		return schemas.Enrollment{}, err
	}
	now := cp.now()
	rec := schemas.NodeRecord{NodeID: req.NodeID, State: schemas.NodeReady}
	rev, err := bus.GetJSON(ctx, cp.nodesKV, req.NodeID, &rec)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		rev = 0
	case err != nil:
		return schemas.Enrollment{}, err
	}
	if req.Generation < rec.Generation {
		return schemas.Enrollment{}, &schemas.Refusal{Code: schemas.CodeStaleGeneration, Field: "generation",
			Reason: fmt.Sprintf("node %s is at generation %d; this agent's bootstrap is older — reprovision it", req.NodeID, rec.Generation)}
	}
	duplicate := rev != 0 && req.Generation == rec.Generation
	rec.RentalID, rec.Generation = req.RentalID, req.Generation
	rec.FencingToken++
	rec.SessionTokenHash = hashToken(token)
	rec.SessionExpires = now.Add(cp.cfg.SessionTTL)
	rec.State, rec.EnrolledAt, rec.LeaseExpires = schemas.NodeReady, now, now.Add(cp.leaseTTL())
	rec.AgentVersion, rec.Capacity, rec.MaxWorkloads = req.AgentVersion, req.Capacity, req.MaxWorkloads
	facts := req.Facts
	rec.Facts, rec.FactsReceivedAt = &facts, now
	// The consumer exists before the record says the node is ready, so no
	// command is published for a node that cannot read it.
	if _, err := cp.conn.JS.CreateOrUpdateConsumer(ctx, bus.StreamCmds, bus.NodeConsumerConfig(req.NodeID)); err != nil {
		return schemas.Enrollment{}, fmt.Errorf("create command consumer for %s: %w", req.NodeID, err)
	}
	var nrev uint64
	if rev == 0 {
		nrev, err = bus.CreateJSON(ctx, cp.nodesKV, req.NodeID, &rec)
	} else {
		var b []byte
		if b, err = codec.Encode(codec.JSON, &rec); err == nil {
			nrev, err = cp.nodesKV.Update(ctx, req.NodeID, b, rev)
		}
	}
	if err != nil {
		// A concurrent enrollment won the CAS; this one must not act.
		return schemas.Enrollment{}, fmt.Errorf("register node %s: %w", req.NodeID, err)
	}
	cp.cache.applyNodeRecord(rec, nrev)
	cp.poke()
	return schemas.Enrollment{
		NodeID: req.NodeID, SessionToken: token, SessionExpires: rec.SessionExpires,
		FencingToken: rec.FencingToken, Generation: rec.Generation, LeaseExpires: rec.LeaseExpires,
		HeartbeatSeconds: int64(cp.cfg.HeartbeatInterval.Seconds() + 0.5), Consumer: bus.NodeConsumer(req.NodeID),
		Duplicate: duplicate,
	}, nil
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

func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("mint token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func hashToken(t string) string {
	s := sha256.Sum256([]byte(t))
	return "sha256:" + hex.EncodeToString(s[:])
}
