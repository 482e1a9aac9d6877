package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// reply answers an operator's session request in JSON.
func (s *Service) reply(m *nats.Msg, rep residency.SessionReply) {
	if err := bus.Respond(m, codec.JSON, rep); err != nil {
		s.log.Error("session reply", zap.String("subject", m.Subject), zap.Error(err))
	}
}

func decodeRequest(m *nats.Msg) (residency.SessionRequest, error) {
	var req residency.SessionRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		return req, fmt.Errorf("%w: body is not a SessionRequest: %v", residency.ErrInvalidRequest, err)
	}
	if err := req.Key().Validate(); err != nil {
		return req, err
	}
	return req, nil
}

// askNode sends one session command to a node's host and decodes its reply.
func (s *Service) askNode(ctx context.Context, n schemas.NodeRecord, op residency.SessionOp, cmd residency.SessionCommand, timeout time.Duration) (residency.SessionReply, error) {
	cmd.FencingToken = n.FencingToken
	b, err := json.Marshal(cmd)
	if err != nil {
		return residency.SessionReply{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg := &nats.Msg{Subject: bus.NodeSessions(n.NodeID, string(op)), Data: b, Header: nats.Header{codec.ContentTypeHeader: []string{codec.ContentTypeJSON}}}
	resp, err := s.conn.NC.RequestMsgWithContext(ctx, msg)
	if errors.Is(err, nats.ErrNoResponders) {
		return residency.SessionReply{}, &residency.WireError{Code: residency.CodeNoHost, Message: "node " + n.NodeID + " hosts no sessions (no session host answered)"}
	}
	if err != nil {
		return residency.SessionReply{}, &residency.WireError{Code: residency.CodeUnavailable, Message: "node " + n.NodeID + ": " + err.Error()}
	}
	var rep residency.SessionReply
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		return residency.SessionReply{}, &residency.WireError{Code: residency.CodeUnavailable, Message: "node " + n.NodeID + ": malformed reply: " + err.Error()}
	}
	return rep, nil
}

// handleAttach places a session on a node and attaches it there.
// Candidates are the ready, live nodes (only the one named, when the request
// pins one), the session's previous host first (its image is warm there);
// a node that refuses for a reason another node may not have (capacity,
// draining, no session host, another runtime build) passes to the next.
func (s *Service) handleAttach(ctx context.Context, st *stores, m *nats.Msg) {
	req, err := decodeRequest(m)
	if err != nil {
		s.reply(m, residency.SessionReply{Error: residency.ToWire(err)})
		return
	}
	key := req.Key()
	if req.Actor == "" {
		req.Actor = "operator"
	}
	if req.Mode == "" {
		_, _, gerr := st.durable.Get(ctx, key)
		switch {
		case gerr == nil:
			req.Mode = residency.ModeResume
		case errors.Is(gerr, jetstream.ErrKeyNotFound):
			req.Mode = residency.ModeCreate
		default:
			s.reply(m, residency.SessionReply{Error: residency.ToWire(gerr)})
			return
		}
	}
	cands, err := s.candidates(ctx, st, key, req.Node)
	if err != nil {
		s.reply(m, residency.SessionReply{Error: residency.ToWire(err)})
		return
	}
	var last *residency.WireError
	for _, n := range cands {
		cmd := residency.SessionCommand{Tenant: key.Tenant, Session: key.Session, Mode: req.Mode, CompatibilityID: req.CompatibilityID, Actor: req.Actor}
		release, err := s.bookGPUs(key, n.NodeID, req.GPUCount, &cmd)
		if err != nil {
			last = residency.ToWire(err)
			s.log.Info("node cannot take session", zap.Stringer("session", key), zap.String("node_id", n.NodeID), zap.Error(err))
			continue
		}
		rep, err := s.askNode(ctx, n, residency.OpAttach, cmd, s.cfg.AttachTimeout)
		release()
		if err == nil && rep.Error == nil {
			s.log.Info("session attached", zap.Stringer("session", key), zap.String("node_id", n.NodeID), zap.String("mode", string(req.Mode)))
			s.reply(m, rep)
			return
		}
		if err == nil {
			err = rep.Error
		}
		last = residency.ToWire(err)
		s.log.Info("node did not attach session", zap.Stringer("session", key), zap.String("node_id", n.NodeID), zap.Error(err))
		if !nodeSpecific(last.Code) {
			break
		}
	}
	if last == nil {
		last = &residency.WireError{Code: residency.CodeCapacity, Message: "no ready node to place session " + key.String() + " on"}
	}
	s.reply(m, residency.SessionReply{Error: last})
}

// bookGPUs books count free cards of node for the session into cmd and
// holds them (cache.Reserve) until release is called: by then the attach
// has published its residency, which holds them from there on, or failed.
func (s *Service) bookGPUs(key residency.Key, node string, count int64, cmd *residency.SessionCommand) (release func(), err error) {
	if count <= 0 {
		return func() {}, nil
	}
	if s.fleet == nil {
		return nil, fmt.Errorf("%w: this control plane books no GPUs for sessions", residency.ErrCapacity)
	}
	s.booking.Lock()
	defer s.booking.Unlock()
	n := s.fleet(s.now()).Node(node)
	if n == nil {
		return nil, fmt.Errorf("%w: node %s is not in the fleet", residency.ErrCapacity, node)
	}
	gpus, devices, ok := n.PickGPUs(count, nil)
	if !ok {
		return nil, fmt.Errorf("%w: node %s has fewer than %d free GPUs it can hand a container", residency.ErrCapacity, node, count)
	}
	cmd.GPUs, cmd.Devices = gpus, devices
	return s.cache.Reserve(residency.Observation{Tenant: key.Tenant, Session: key.Session, Host: node, State: residency.StateAttaching, GPUs: gpus}), nil
}

// nodeSpecific reports whether an attach refusal is the node's, so another
// node may still attach the session; a refusal about the session itself (its
// lease is held, its state is missing or of another build) ends the search.
func nodeSpecific(c residency.Code) bool {
	switch c {
	case residency.CodeCapacity, residency.CodeDraining, residency.CodeNoHost, residency.CodeRuntimeMismatch,
		residency.CodeUnavailable, residency.CodeStaleNode, residency.CodeLaunch, residency.CodeWorkspace, residency.CodeClosed:
		return true
	}
	return false
}

// candidates are the nodes an attach may go to, in preference order.
func (s *Service) candidates(ctx context.Context, st *stores, key residency.Key, pinned string) ([]schemas.NodeRecord, error) {
	now := s.now()
	if pinned != "" {
		var n schemas.NodeRecord
		if _, err := bus.GetJSON(ctx, s.nodesKV, pinned, &n); err != nil {
			return nil, fmt.Errorf("%w: node %s: %w", residency.ErrInvalidRequest, pinned, err)
		}
		// The stored lease is the one written at the last state change; the
		// node's heartbeats since have earned the one in memory.
		if l := s.cache.MemLeaseOf(pinned, n.FencingToken); l.After(n.LeaseExpires) {
			n.LeaseExpires = l
		}
		if n.State != schemas.NodeReady || !n.Live(now) {
			return nil, fmt.Errorf("%w: node %s is %s (live %v)", residency.ErrDraining, pinned, n.State, n.Live(now))
		}
		return []schemas.NodeRecord{n}, nil
	}
	var out []schemas.NodeRecord
	for _, n := range s.cache.Nodes() {
		if n.State == schemas.NodeReady && n.Live(now) {
			out = append(out, n)
		}
	}
	prev := ""
	if obs, _, err := st.locations.Get(ctx, key); err == nil {
		prev = obs.Host
	}
	sort.SliceStable(out, func(i, j int) bool {
		if (out[i].NodeID == prev) != (out[j].NodeID == prev) {
			return out[i].NodeID == prev
		}
		return out[i].NodeID < out[j].NodeID
	})
	return out, nil
}

// handleRelease releases a session gracefully on the node whose route
// wf_residency holds.
func (s *Service) handleRelease(ctx context.Context, st *stores, m *nats.Msg) {
	req, err := decodeRequest(m)
	if err != nil {
		s.reply(m, residency.SessionReply{Error: residency.ToWire(err)})
		return
	}
	key := req.Key()
	obs, _, err := st.locations.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || (err == nil && obs.State == residency.StateExpired):
		s.reply(m, residency.SessionReply{Error: &residency.WireError{Code: residency.CodeNotResident, Message: "session " + key.String() + " is resident nowhere"}})
		return
	case err != nil:
		s.reply(m, residency.SessionReply{Error: residency.ToWire(err)})
		return
	}
	var n schemas.NodeRecord
	if _, err := bus.GetJSON(ctx, s.nodesKV, obs.Host, &n); err != nil {
		s.reply(m, residency.SessionReply{Error: &residency.WireError{Code: residency.CodeUnavailable, Message: "node " + obs.Host + ": " + err.Error()}})
		return
	}
	rep, err := s.askNode(ctx, n, residency.OpRelease, residency.SessionCommand{Tenant: key.Tenant, Session: key.Session}, s.cfg.DrainTimeout)
	if err != nil {
		rep = residency.SessionReply{Error: residency.ToWire(err)}
	}
	if rep.Error == nil {
		s.log.Info("session released", zap.Stringer("session", key), zap.String("node_id", n.NodeID))
	}
	s.reply(m, rep)
}
