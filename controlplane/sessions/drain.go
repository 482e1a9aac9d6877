package sessions

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// DrainNode releases every session resident on the draining node rec and
// reports what it released and what it could not; nil when the Service is
// not serving.
func (s *Service) DrainNode(ctx context.Context, rec schemas.NodeRecord) *schemas.DrainView {
	if s.serving.Load() == nil {
		return nil
	}
	v := s.drainSessions(ctx, rec)
	if len(v.Failures) > 0 || (v.Error != nil && v.Error.Code != residency.CodeNoHost) {
		s.log.Warn("node drain left sessions held", zap.String("node_id", rec.NodeID), zap.Int("released", len(v.Released)),
			zap.Int("unreleased", len(v.Failures)), zap.Any("drain_error", v.Error))
	} else if len(v.Released) > 0 {
		s.log.Info("node drain released sessions", zap.String("node_id", rec.NodeID), zap.Int("released", len(v.Released)))
	}
	return &v
}

// drainSessions asks a draining node to release every resident session
// gracefully, and reports what it released and what it could not. A node
// without a session host, or one that does not answer, has its routes
// reported from wf_residency as unreleased.
func (s *Service) drainSessions(ctx context.Context, n schemas.NodeRecord) schemas.DrainView {
	rep, err := s.askNode(ctx, n, schemas.SessionDrain, schemas.SessionCommand{}, s.cfg.DrainTimeout)
	if err == nil && rep.Error != nil {
		err = rep.Error
	}
	var v schemas.DrainView
	switch {
	case err == nil && rep.Drain != nil:
		v = *rep.Drain
	case err == nil:
		v = schemas.DrainView{Node: n.NodeID, Error: &schemas.SessionError{Code: residency.CodeUnavailable, Message: "drain reply carried no report"}}
	default:
		v = schemas.DrainView{Node: n.NodeID, Error: residency.ToWire(err)}
	}
	if v.Released == nil {
		v.Released = []schemas.SessionKey{}
	}
	// Whatever wf_residency still routes to the node was not released.
	held := map[schemas.SessionKey]bool{}
	for _, f := range v.Failures {
		held[f.Key] = true
	}
	routes, err := s.Routes(ctx)
	if err != nil {
		s.log.Warn("drain: routes not read", zap.Error(err))
	}
	for _, o := range routes {
		if o.Host == n.NodeID && o.State != residency.StateExpired && !held[residency.WireKey(o.Key())] {
			v.Failures = append(v.Failures, schemas.DrainFailure{Key: residency.WireKey(o.Key()), Reason: "still routed to this node (" + string(o.State) + " at epoch " + fmt.Sprint(o.Epoch) + ")"})
		}
	}
	return v
}
