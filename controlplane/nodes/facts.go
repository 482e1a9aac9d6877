package nodes

import (
	"context"
	"errors"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// RecordFacts stores a node's latest facts on its record, when token is
// still the node's session; a superseded session's facts are counted and
// dropped.
func (s *Service) RecordFacts(ctx context.Context, nodeID string, token uint64, f schemas.NodeFacts) error {
	now := s.cfg.Now()
	f.Normalize()
	rec, rev, err := bus.UpdateJSON(ctx, s.nodesKV, nodeID, func(n *schemas.NodeRecord) error {
		if n.FencingToken != token {
			return errFenced
		}
		n.Facts, n.FactsReceivedAt = &f, now
		return nil
	})
	if errors.Is(err, errFenced) {
		s.fenced.Add(1)
		return nil
	}
	if err != nil {
		return err
	}
	s.cache.NoteNode(rec, rev)
	return nil
}
