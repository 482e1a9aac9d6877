package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// operatorServer serves one of an operator's session subjects: replies
// in JSON, errors as the session protocol's (schemas.SessionError), and a
// goroutine per request (an attach may wait minutes on an image pull).
func (s *Service) operatorServer(subject string, answer func(context.Context, string, schemas.SessionRequest) schemas.SessionReply) *requests.Server[schemas.SessionRequest, schemas.SessionReply] {
	return &requests.Server[schemas.SessionRequest, schemas.SessionReply]{
		Subject: subject, What: "session request", Malformed: "body is not a SessionRequest", JSON: true, Log: s.log,
		Validate: func(r *schemas.SessionRequest) error {
			if err := residency.KeyOf(r.Key()).Validate(); err != nil {
				return err
			}
			return s.checkTenant(r.Tenant)
		},
		Answer: answer,
		Refuse: func(_ *schemas.Refusal, err error) schemas.SessionReply {
			if errors.Is(err, codec.ErrMalformed) {
				err = fmt.Errorf("%w: body is not a SessionRequest: %v", residency.ErrInvalidRequest, err)
			}
			return schemas.SessionReply{Error: residency.ToWire(err)}
		},
	}
}

// checkTenant refuses a session key whose tenant is no tenant name, or
// not a configured tenant, naming the field.
func (s *Service) checkTenant(tenant string) error {
	if err := schemas.ValidateTenant("tenant", tenant); err != nil {
		r := schemas.AsRefusal(err)
		return &schemas.SessionError{Code: schemas.SessionCode(r.Code), Field: "tenant", Message: fmt.Sprintf("tenant %q: %s", tenant, r.Reason)}
	}
	if len(s.cfg.Tenants) > 0 && !slices.Contains(s.cfg.Tenants, tenant) {
		return &schemas.SessionError{Code: schemas.SessionCode(schemas.CodeTenantUnknown), Field: "tenant",
			Message: fmt.Sprintf("tenant %q: this control plane has no such tenant (it has %s); name one with --tenant", tenant, strings.Join(s.cfg.Tenants, ", "))}
	}
	return nil
}

// askNode sends one session command to a node's host and decodes its reply.
func (s *Service) askNode(ctx context.Context, n schemas.NodeRecord, op schemas.SessionOp, cmd schemas.SessionCommand, timeout time.Duration) (schemas.SessionReply, error) {
	cmd.FencingToken = n.FencingToken
	b, err := json.Marshal(cmd)
	if err != nil {
		return schemas.SessionReply{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg := &nats.Msg{Subject: bus.NodeSessions(n.NodeID, string(op)), Data: b, Header: nats.Header{codec.ContentTypeHeader: []string{codec.ContentTypeJSON}}}
	resp, err := s.conn.NC.RequestMsgWithContext(ctx, msg)
	if errors.Is(err, nats.ErrNoResponders) {
		return schemas.SessionReply{}, &schemas.SessionError{Code: residency.CodeNoHost, Message: "node " + n.NodeID + " hosts no sessions (no session host answered)"}
	}
	if err != nil {
		return schemas.SessionReply{}, &schemas.SessionError{Code: residency.CodeUnavailable, Message: "node " + n.NodeID + ": " + err.Error()}
	}
	rep, err := decodeSessionReply(resp.Data)
	if err != nil {
		return schemas.SessionReply{}, &schemas.SessionError{Code: residency.CodeUnavailable, Message: "node " + n.NodeID + ": malformed reply: " + err.Error()}
	}
	return rep, nil
}

// attach places a session on a node and attaches it there.
// Candidates are the ready, live nodes (only the one named, when the request
// pins one), the session's previous host first (its image is warm there);
// a node that refuses for a reason another node may not have (capacity,
// draining, no session host, another runtime build) passes to the next.
func (s *Service) attach(ctx context.Context, st *stores, req schemas.SessionRequest) schemas.SessionReply {
	key := residency.KeyOf(req.Key())
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
			return schemas.SessionReply{Error: residency.ToWire(gerr)}
		}
	}
	cands, err := s.candidates(ctx, st, key, req.Node)
	if err != nil {
		return schemas.SessionReply{Error: residency.ToWire(err)}
	}
	var last *schemas.SessionError
	for _, n := range cands {
		cmd := schemas.SessionCommand{Tenant: key.Tenant, Session: key.Session, Mode: req.Mode, CompatibilityID: req.CompatibilityID, Actor: req.Actor,
			FromCheckpoint: req.FromCheckpoint}
		release, err := s.bookGPUs(key, n.NodeID, req.GPUCount, &cmd)
		if err != nil {
			last = residency.ToWire(err)
			s.log.Info("node cannot take session", zap.Stringer("session", key), zap.String("node_id", n.NodeID), zap.Error(err))
			continue
		}
		// Placed before asked: the node's lease acquire, on whichever
		// replica it lands, checks it.
		if err := st.placements.place(ctx, key, n.NodeID, s.now().Add(s.cfg.AttachTimeout)); err != nil {
			release()
			return schemas.SessionReply{Error: residency.ToWire(err)}
		}
		rep, err := s.askNode(ctx, n, schemas.SessionAttach, cmd, s.cfg.AttachTimeout)
		release()
		if err == nil && rep.Error == nil {
			s.log.Info("session attached", zap.Stringer("session", key), zap.String("node_id", n.NodeID), zap.String("mode", string(req.Mode)))
			if v := rep.Residency; v != nil && v.Attached {
				st.events.attached(ctx, *v)
			}
			return rep
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
		last = &schemas.SessionError{Code: residency.CodeCapacity, Message: "no ready node to place session " + key.String() + " on"}
	}
	return schemas.SessionReply{Error: last}
}

// bookGPUs books count free cards of node for the session into cmd and
// holds them (cache.Reserve) until release is called: by then the attach
// has published its residency, which holds them from there on, or failed.
func (s *Service) bookGPUs(key residency.Key, node string, count int64, cmd *schemas.SessionCommand) (release func(), err error) {
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
		n = s.cache.WithLease(n)
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

// release releases a session gracefully on the node whose route
// wf_residency holds.
func (s *Service) release(ctx context.Context, st *stores, req schemas.SessionRequest) schemas.SessionReply {
	key := residency.KeyOf(req.Key())
	obs, _, err := st.locations.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || (err == nil && obs.State == residency.StateExpired):
		return schemas.SessionReply{Error: &schemas.SessionError{Code: residency.CodeNotResident, Message: "session " + key.String() + " is resident nowhere"}}
	case err != nil:
		return schemas.SessionReply{Error: residency.ToWire(err)}
	}
	var n schemas.NodeRecord
	if _, err := bus.GetJSON(ctx, s.nodesKV, obs.Host, &n); err != nil {
		return schemas.SessionReply{Error: &schemas.SessionError{Code: residency.CodeUnavailable, Message: "node " + obs.Host + ": " + err.Error()}}
	}
	rep, err := s.askNode(ctx, n, schemas.SessionRelease, schemas.SessionCommand{Tenant: key.Tenant, Session: key.Session}, s.cfg.DrainTimeout)
	if err != nil {
		rep = schemas.SessionReply{Error: residency.ToWire(err)}
	}
	if rep.Error == nil {
		s.log.Info("session released", zap.Stringer("session", key), zap.String("node_id", n.NodeID))
	}
	return rep
}

// decodeSessionReply decodes a session host's reply within the limits on
// what a node sends: its size before decoding, strictly, then Validate.
func decodeSessionReply(data []byte) (schemas.SessionReply, error) {
	var rep schemas.SessionReply
	if err := schemas.DecodeNodeMessage(codec.JSON, data, &rep); err != nil {
		return schemas.SessionReply{}, err
	}
	return rep, nil
}
