package nodes

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// handleDrain marks a node draining: it takes no new Runs, finishes what it
// runs, and a rented node is then retired by the rental loop.
func (s *Service) handleDrain(ctx context.Context, m *nats.Msg) {
	var req schemas.AdminRequest
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = schemas.ValidateID("node_id", req.ID, schemas.CodeMalformed)
	}
	if err != nil {
		respond(s.log, m, enc, schemas.Reply[schemas.NodeRecord]{Refusal: schemas.RefusalOfInput(err, "body is not an AdminRequest")})
		return
	}
	rec, rev, err := bus.UpdateJSON(ctx, s.nodesKV, req.ID, func(n *schemas.NodeRecord) error {
		if n.State == schemas.NodeDraining {
			return bus.ErrNoChange
		}
		n.State = schemas.NodeDraining
		return nil
	})
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		respond(s.log, m, enc, schemas.Reply[schemas.NodeRecord]{Refusal: &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "id", Reason: "no node " + req.ID + "; `warmfleet node list` shows them"}})
		return
	case err != nil && !errors.Is(err, bus.ErrNoChange):
		respond(s.log, m, enc, schemas.Reply[schemas.NodeRecord]{Refusal: schemas.AsRefusal(err)})
		return
	case err == nil:
		s.cache.NoteNode(rec, rev)
	}
	s.log.Info("node draining", zap.String("node_id", req.ID))
	rep := schemas.NodeDrainReply{}
	if s.sessions != nil {
		rep.Sessions = s.sessions.DrainNode(ctx, rec)
	}
	rec.SessionTokenHash = ""
	rep.OK = &rec
	respond(s.log, m, enc, rep)
}
