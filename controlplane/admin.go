package controlplane

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// handleDrain marks a node draining: it takes no new Runs, finishes what it
// runs, and a rented node is then retired by the rental loop.
func (cp *ControlPlane) handleDrain(ctx context.Context, m *nats.Msg) {
	var req schemas.AdminRequest
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = schemas.ValidateID("node_id", req.ID, schemas.CodeMalformed)
	}
	if err != nil {
		cp.reply(m, enc, schemas.Reply[schemas.NodeRecord]{Refusal: refusalOf(err, "body is not an AdminRequest")})
		return
	}
	rec, rev, err := bus.UpdateJSON(ctx, cp.nodesKV, req.ID, func(n *schemas.NodeRecord) error {
		if n.State == schemas.NodeDraining {
			return bus.ErrNoChange
		}
		n.State = schemas.NodeDraining
		return nil
	})
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		cp.reply(m, enc, schemas.Reply[schemas.NodeRecord]{Refusal: &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "id", Reason: "no node " + req.ID + "; `warmfleet node list` shows them"}})
		return
	case err != nil && !errors.Is(err, bus.ErrNoChange):
		cp.reply(m, enc, schemas.Reply[schemas.NodeRecord]{Refusal: schemas.AsRefusal(err)})
		return
	case err == nil:
		cp.cache.applyNodeRecord(rec, rev)
	}
	cp.log.Info("node draining", zap.String("node_id", req.ID))
	rep := DrainReply{Sessions: cp.drainNodeSessions(ctx, rec)}
	rec.SessionTokenHash = ""
	rep.OK = &rec
	cp.reply(m, enc, rep)
}

// handleNodeLeases answers with every node's live lease, or one node's when
// the request names it (an empty body asks for all). Every replica sees
// every heartbeat, so any replica's answer is current.
func (cp *ControlPlane) handleNodeLeases(m *nats.Msg) {
	var req schemas.AdminRequest
	enc := codec.JSON
	if len(m.Data) > 0 {
		var err error
		if enc, err = codec.DecodeMsg(m, &req); err == nil && req.ID != "" {
			err = schemas.ValidateID("id", req.ID, schemas.CodeMalformed)
		}
		if err != nil {
			cp.reply(m, enc, schemas.Reply[[]schemas.NodeLease]{Refusal: refusalOf(err, "body is empty or an AdminRequest naming a node")})
			return
		}
	}
	var out []schemas.NodeLease
	for _, n := range cp.cache.nodeList() {
		if req.ID == "" || n.NodeID == req.ID {
			out = append(out, schemas.NodeLease{NodeID: n.NodeID, FencingToken: n.FencingToken, State: n.State, LeaseExpires: n.LeaseExpires})
		}
	}
	if req.ID != "" && len(out) == 0 {
		cp.reply(m, enc, schemas.Reply[[]schemas.NodeLease]{Refusal: &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "id", Reason: "no node " + req.ID + "; `warmfleet node list` shows them"}})
		return
	}
	cp.reply(m, enc, schemas.Reply[[]schemas.NodeLease]{OK: &out})
}

// DrainReply answers wf.admin.node.drain: the node record, as the
// schemas.Reply[schemas.NodeRecord] every caller decodes, and the sessions
// the drain released and could not release.
type DrainReply struct {
	OK      *schemas.NodeRecord `json:"ok,omitempty"`
	Refusal *schemas.Refusal    `json:"refusal,omitempty"`
	// Sessions is the node's session drain; nil when the control plane
	// serves no sessions.
	Sessions *residency.DrainView `json:"sessions,omitempty"`
}

// drainNodeSessions releases every session resident on the draining node
// gracefully and reports what could not be released.
func (cp *ControlPlane) drainNodeSessions(ctx context.Context, rec schemas.NodeRecord) *residency.DrainView {
	if cp.sessions == nil {
		return nil
	}
	v := cp.drainSessions(ctx, rec)
	if len(v.Failures) > 0 || (v.Error != nil && v.Error.Code != residency.CodeNoHost) {
		cp.log.Warn("node drain left sessions held", zap.String("node_id", rec.NodeID), zap.Int("released", len(v.Released)),
			zap.Int("unreleased", len(v.Failures)), zap.Any("drain_error", v.Error))
	} else if len(v.Released) > 0 {
		cp.log.Info("node drain released sessions", zap.String("node_id", rec.NodeID), zap.Int("released", len(v.Released)))
	}
	return &v
}

// handleRetire asks for a rental to be retired once its node is idle.
func (cp *ControlPlane) handleRetire(ctx context.Context, m *nats.Msg) {
	var req schemas.AdminRequest
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = schemas.ValidateID("rental_id", req.ID, schemas.CodeMalformed)
	}
	if err != nil {
		cp.reply(m, enc, schemas.Reply[schemas.Rental]{Refusal: refusalOf(err, "body is not an AdminRequest")})
		return
	}
	err = cp.updateRental(ctx, req.ID, func(s *schemas.Rental, now time.Time) error {
		if s.State != schemas.RentalReady {
			return &schemas.Refusal{Code: schemas.CodeMalformed, Field: "id", Reason: "only a ready rental can be retired; it is " + string(s.State)}
		}
		return setRentalState(s, schemas.RentalDraining, time.Time{}, now)
	})
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		err = &schemas.Refusal{Code: schemas.CodeMalformed, Field: "id", Reason: "no rental " + req.ID + "; `warmfleet rental list` shows them"}
	}
	if err != nil {
		cp.reply(m, enc, schemas.Reply[schemas.Rental]{Refusal: schemas.AsRefusal(err)})
		return
	}
	var rt schemas.Rental
	_, _ = bus.GetJSON(ctx, cp.rentalsKV, req.ID, &rt)
	cp.reply(m, enc, schemas.Reply[schemas.Rental]{OK: &rt})
}
