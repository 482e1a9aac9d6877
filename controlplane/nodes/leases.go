package nodes

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/schemas"
)

// leasesServer serves wf.admin.node.leases: an empty body asks for every
// node's lease.
func (s *Service) leasesServer() *requests.Server[schemas.AdminRequest, schemas.Reply[[]schemas.NodeLease]] {
	srv := requests.Coded(bus.SubjectNodeLeases, "body is empty or an AdminRequest naming a node", func(r *schemas.AdminRequest) error {
		if r.ID == "" {
			return nil
		}
		return schemas.ValidateID("id", r.ID, schemas.CodeMalformed)
	}, s.leases, s.log)
	srv.Empty = true
	return srv
}

// leases answers with every node's live lease, or one node's when the
// request names it. Every replica sees every heartbeat, so any replica's
// answer is current.
func (s *Service) leases(_ context.Context, _ string, req schemas.AdminRequest) ([]schemas.NodeLease, error) {
	var out []schemas.NodeLease
	for _, n := range s.cache.Nodes() {
		if req.ID == "" || n.NodeID == req.ID {
			out = append(out, schemas.NodeLease{NodeID: n.NodeID, FencingToken: n.FencingToken, State: n.State, LeaseExpires: n.LeaseExpires})
		}
	}
	if req.ID != "" && len(out) == 0 {
		return nil, &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "id", Reason: "no node " + req.ID + "; `warmfleet node list` shows them"}
	}
	return out, nil
}

// SweepLeases marks nodes whose lease lapsed as lost and ends the attempts
// booked on them (back to accepted for another attempt, or lost when
// attempts are spent); it reports whether any Run changed. A node's lease
// is the later of its record's and the one its heartbeats earned in this
// replica's memory (controlplane/cache); marking it lost is a CAS that
// also writes the lease this replica saw, so the record says when the node
// was last heard of.
func (s *Service) SweepLeases(ctx context.Context, now time.Time, active []*schemas.Run) bool {
	lost := map[string]bool{}
	for _, n := range s.cache.Nodes() {
		if n.State == schemas.NodeLost {
			lost[n.NodeID] = true
		}
		if n.State == schemas.NodeLost || now.Before(n.LeaseExpires) {
			continue
		}
		rec, rev, err := bus.UpdateJSON(ctx, s.nodesKV, n.NodeID, func(r *schemas.NodeRecord) error {
			lease := s.cache.WithLease(*r).LeaseExpires
			if r.State == schemas.NodeLost || now.Before(lease) {
				return bus.ErrNoChange
			}
			r.State, r.LeaseExpires = schemas.NodeLost, lease
			return nil
		})
		if err != nil {
			if !errors.Is(err, bus.ErrNoChange) {
				s.log.Warn("mark node lost", zap.String("node_id", n.NodeID), zap.Error(err))
			}
			continue
		}
		s.cache.NoteNode(rec, rev)
		lost[n.NodeID] = true
		s.leaseLapses.Add(1)
		s.log.Warn("node lease lapsed", zap.String("node_id", n.NodeID), zap.Time("lease_expired", n.LeaseExpires))
	}
	if len(lost) == 0 {
		return false
	}
	var booked []*schemas.Run
	for _, r := range active {
		if lost[r.NodeID] {
			booked = append(booked, r)
		}
	}
	return s.runs.LoseAttempts(ctx, booked, schemas.CodeNodeLost, func(nodeID string) string { return "node " + nodeID + " stopped heartbeating" })
}
