package nodes

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/schemas"
)

// drainServer serves wf.admin.node.drain, whose reply carries the
// node's session drain beside the record.
func (s *Service) drainServer() *requests.Server[schemas.AdminRequest, schemas.NodeDrainReply] {
	return &requests.Server[schemas.AdminRequest, schemas.NodeDrainReply]{
		Subject: bus.SubjectDrain, Malformed: "body is not an AdminRequest", Pool: requests.DefaultPool(), Log: s.log,
		Validate: func(r *schemas.AdminRequest) error { return schemas.ValidateID("node_id", r.ID, schemas.CodeMalformed) },
		Answer:   s.drain,
		Refuse: func(r *schemas.Refusal, _ error) schemas.NodeDrainReply {
			return schemas.NodeDrainReply{Refusal: r}
		},
	}
}

// drain marks a node draining: it takes no new Runs, finishes what it
// runs, and a rented node is then retired by the rental loop. Its resident
// sessions are released.
func (s *Service) drain(ctx context.Context, _ string, req schemas.AdminRequest) schemas.NodeDrainReply {
	rec, rev, err := bus.UpdateJSON(ctx, s.nodesKV, req.ID, func(n *schemas.NodeRecord) error {
		if n.State == schemas.NodeDraining {
			return bus.ErrNoChange
		}
		n.State = schemas.NodeDraining
		return nil
	})
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return schemas.NodeDrainReply{Refusal: &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "id", Reason: "no node " + req.ID + "; `warmfleet node list` shows them"}}
	case err != nil && !errors.Is(err, bus.ErrNoChange):
		return schemas.NodeDrainReply{Refusal: schemas.AsRefusal(err)}
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
	return rep
}
