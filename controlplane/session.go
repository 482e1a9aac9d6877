package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// SessionConfig tunes session residency (see package residency).
type SessionConfig struct {
	// LeaseTTL is each session lease's lifetime from its last renewal; a
	// lost host's sessions can be resumed elsewhere this long after its last
	// renewal. 15 s when zero.
	LeaseTTL time.Duration
	// InboxAckWait is how long inbox work taken by a host that then
	// vanished waits before it is redelivered to the next holder; it must
	// exceed the longest a session takes over one message. 30 s when zero.
	InboxAckWait time.Duration
	// AttachTimeout bounds one node's attach (an image pull included);
	// 2 min when zero.
	AttachTimeout time.Duration
	// DrainTimeout bounds a node's session drain; 60 s when zero.
	DrainTimeout time.Duration
}

func (c SessionConfig) withDefaults() SessionConfig {
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 15 * time.Second
	}
	if c.InboxAckWait <= 0 {
		c.InboxAckWait = 30 * time.Second
	}
	if c.AttachTimeout <= 0 {
		c.AttachTimeout = 2 * time.Minute
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 60 * time.Second
	}
	return c
}

// sessions is the control plane's side of residency: the stores agents
// reach over wf.node.<id>.residency.*, and the operator's session requests.
type sessions struct {
	cfg       SessionConfig
	leases    *residency.KVLeases
	locations *residency.KVLocations
	durable   *residency.KVSessions
	// wg owns the goroutines answering operators' session requests.
	wg sync.WaitGroup
}

// serveSessions starts the residency services and the operator's session
// subjects. The returned function stops them.
func (cp *ControlPlane) serveSessions(ctx context.Context) (func(), error) {
	cfg := cp.cfg.Sessions.withDefaults()
	clock := residency.SystemClock{}
	leases, err := residency.NewKVLeases(ctx, residency.KVLeasesOptions{JS: cp.conn.JS, TTL: cfg.LeaseTTL, InboxAckWait: cfg.InboxAckWait, Clock: clock, Logger: cp.log})
	if err != nil {
		return nil, err
	}
	locs, err := residency.NewKVLocations(ctx, residency.KVLocationsOptions{JS: cp.conn.JS, Clock: clock, Logger: cp.log})
	if err != nil {
		return nil, err
	}
	durable, err := residency.NewKVSessions(ctx, residency.KVSessionsOptions{JS: cp.conn.JS, Clock: clock, Logger: cp.log})
	if err != nil {
		return nil, err
	}
	ss := &sessions{cfg: cfg, leases: leases, locations: locs, durable: durable}
	cp.sessions = ss
	svc, err := residency.NewService(residency.Services{Leases: leases, Locations: locs, Sessions: durable}, cp.log)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	stopSvc, err := svc.Serve(ctx, cp.conn.NC, "warmfleet-cp")
	if err != nil {
		cancel()
		return nil, err
	}
	subs := []*nats.Subscription{}
	stop := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
		cancel()
		stopSvc()
		ss.wg.Wait()
	}
	// An attach may wait minutes on an image pull: each request gets its
	// own goroutine, owned by ss.wg, so one does not hold up the next.
	if err := cp.queueSubscribeAll(&subs, map[string]nats.MsgHandler{
		bus.SubjectSessionAttach:  func(m *nats.Msg) { ss.wg.Go(func() { cp.handleSessionAttach(ctx, m) }) },
		bus.SubjectSessionRelease: func(m *nats.Msg) { ss.wg.Go(func() { cp.handleSessionRelease(ctx, m) }) },
	}); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// replySession answers an operator's session request in JSON.
func (cp *ControlPlane) replySession(m *nats.Msg, rep residency.SessionReply) {
	if m.Reply == "" {
		return
	}
	b, err := json.Marshal(rep)
	if err != nil {
		cp.log.Error("encode session reply", zap.Error(err))
		return
	}
	_ = m.RespondMsg(&nats.Msg{Subject: m.Reply, Data: b, Header: nats.Header{"Content-Type": []string{"application/json"}}})
}

func decodeSessionRequest(m *nats.Msg) (residency.SessionRequest, error) {
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
func (cp *ControlPlane) askNode(ctx context.Context, n schemas.NodeRecord, op residency.SessionOp, cmd residency.SessionCommand, timeout time.Duration) (residency.SessionReply, error) {
	cmd.FencingToken = n.FencingToken
	b, err := json.Marshal(cmd)
	if err != nil {
		return residency.SessionReply{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg := &nats.Msg{Subject: bus.NodeSessions(n.NodeID, string(op)), Data: b, Header: nats.Header{"Content-Type": []string{"application/json"}}}
	resp, err := cp.conn.NC.RequestMsgWithContext(ctx, msg)
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

// handleSessionAttach places a session on a node and attaches it there.
// Candidates are the ready, live nodes (only the one named, when the request
// pins one), the session's previous host first (its image is warm there);
// a node that refuses for a reason another node may not have (capacity,
// draining, no session host, another runtime build) passes to the next.
func (cp *ControlPlane) handleSessionAttach(ctx context.Context, m *nats.Msg) {
	req, err := decodeSessionRequest(m)
	if err != nil {
		cp.replySession(m, residency.SessionReply{Error: residency.ToWire(err)})
		return
	}
	s := cp.sessions
	key := req.Key()
	if req.Actor == "" {
		req.Actor = "operator"
	}
	if req.Mode == "" {
		_, _, gerr := s.durable.Get(ctx, key)
		switch {
		case gerr == nil:
			req.Mode = residency.ModeResume
		case errors.Is(gerr, jetstream.ErrKeyNotFound):
			req.Mode = residency.ModeCreate
		default:
			cp.replySession(m, residency.SessionReply{Error: residency.ToWire(gerr)})
			return
		}
	}
	cands, err := cp.sessionCandidates(ctx, key, req.Node)
	if err != nil {
		cp.replySession(m, residency.SessionReply{Error: residency.ToWire(err)})
		return
	}
	var last *residency.WireError
	for _, n := range cands {
		rep, err := cp.askNode(ctx, n, residency.OpAttach, residency.SessionCommand{
			Tenant: key.Tenant, Session: key.Session, Mode: req.Mode, CompatibilityID: req.CompatibilityID, Actor: req.Actor,
		}, s.cfg.AttachTimeout)
		if err == nil && rep.Error == nil {
			cp.log.Info("session attached", zap.Stringer("session", key), zap.String("node_id", n.NodeID), zap.String("mode", string(req.Mode)))
			cp.replySession(m, rep)
			return
		}
		if err == nil {
			err = rep.Error
		}
		last = residency.ToWire(err)
		cp.log.Info("node did not attach session", zap.Stringer("session", key), zap.String("node_id", n.NodeID), zap.Error(err))
		if !nodeSpecific(last.Code) {
			break
		}
	}
	if last == nil {
		last = &residency.WireError{Code: residency.CodeCapacity, Message: "no ready node to place session " + key.String() + " on"}
	}
	cp.replySession(m, residency.SessionReply{Error: last})
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

// sessionCandidates are the nodes an attach may go to, in preference order.
func (cp *ControlPlane) sessionCandidates(ctx context.Context, key residency.Key, pinned string) ([]schemas.NodeRecord, error) {
	now := cp.now()
	var out []schemas.NodeRecord
	if pinned != "" {
		var n schemas.NodeRecord
		if _, err := bus.GetJSON(ctx, cp.nodesKV, pinned, &n); err != nil {
			return nil, fmt.Errorf("%w: node %s: %w", residency.ErrInvalidRequest, pinned, err)
		}
		if n.State != schemas.NodeReady || !n.Live(now) {
			return nil, fmt.Errorf("%w: node %s is %s (live %v)", residency.ErrDraining, pinned, n.State, n.Live(now))
		}
		return []schemas.NodeRecord{n}, nil
	}
	for _, n := range cp.cache.nodeList() {
		if n.State == schemas.NodeReady && n.Live(now) {
			out = append(out, n)
		}
	}
	prev := ""
	if obs, _, err := cp.sessions.locations.Get(ctx, key); err == nil {
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

// handleSessionRelease releases a session gracefully on the node whose
// route wf_residency holds.
func (cp *ControlPlane) handleSessionRelease(ctx context.Context, m *nats.Msg) {
	req, err := decodeSessionRequest(m)
	if err != nil {
		cp.replySession(m, residency.SessionReply{Error: residency.ToWire(err)})
		return
	}
	key := req.Key()
	obs, _, err := cp.sessions.locations.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || (err == nil && obs.State == residency.StateExpired):
		cp.replySession(m, residency.SessionReply{Error: &residency.WireError{Code: residency.CodeNotResident, Message: "session " + key.String() + " is resident nowhere"}})
		return
	case err != nil:
		cp.replySession(m, residency.SessionReply{Error: residency.ToWire(err)})
		return
	}
	var n schemas.NodeRecord
	if _, err := bus.GetJSON(ctx, cp.nodesKV, obs.Host, &n); err != nil {
		cp.replySession(m, residency.SessionReply{Error: &residency.WireError{Code: residency.CodeUnavailable, Message: "node " + obs.Host + ": " + err.Error()}})
		return
	}
	rep, err := cp.askNode(ctx, n, residency.OpRelease, residency.SessionCommand{Tenant: key.Tenant, Session: key.Session}, cp.sessions.cfg.DrainTimeout)
	if err != nil {
		rep = residency.SessionReply{Error: residency.ToWire(err)}
	}
	if rep.Error == nil {
		cp.log.Info("session released", zap.Stringer("session", key), zap.String("node_id", n.NodeID))
	}
	cp.replySession(m, rep)
}

// drainSessions asks a draining node to release every resident session
// gracefully, and reports what it released and what it could not. A node
// without a session host, or one that does not answer, has its routes
// reported from wf_residency as unreleased.
func (cp *ControlPlane) drainSessions(ctx context.Context, n schemas.NodeRecord) residency.DrainView {
	rep, err := cp.askNode(ctx, n, residency.OpDrain, residency.SessionCommand{}, cp.sessions.cfg.DrainTimeout)
	if err == nil && rep.Error != nil {
		err = rep.Error
	}
	var v residency.DrainView
	switch {
	case err == nil && rep.Drain != nil:
		v = *rep.Drain
	case err == nil:
		v = residency.DrainView{Node: n.NodeID, Error: &residency.WireError{Code: residency.CodeUnavailable, Message: "drain reply carried no report"}}
	default:
		v = residency.DrainView{Node: n.NodeID, Error: residency.ToWire(err)}
	}
	if v.Released == nil {
		v.Released = []residency.Key{}
	}
	// Whatever wf_residency still routes to the node was not released.
	held := map[residency.Key]bool{}
	for _, f := range v.Failures {
		held[f.Key] = true
	}
	routes, err := cp.SessionRoutes(ctx)
	if err != nil {
		cp.log.Warn("drain: routes not read", zap.Error(err))
	}
	for _, o := range routes {
		if o.Host == n.NodeID && o.State != residency.StateExpired && !held[o.Key()] {
			v.Failures = append(v.Failures, residency.DrainFailure{Key: o.Key(), Reason: "still routed to this node (" + string(o.State) + " at epoch " + fmt.Sprint(o.Epoch) + ")"})
		}
	}
	return v
}

// SessionRoutes lists every observation in wf_residency.
func (cp *ControlPlane) SessionRoutes(ctx context.Context) ([]residency.Observation, error) {
	return ListRoutes(ctx, cp.conn.JS)
}

// ListRoutes reads every observation in wf_residency, sorted by key.
func ListRoutes(ctx context.Context, js jetstream.JetStream) ([]residency.Observation, error) {
	kv, err := js.KeyValue(ctx, bus.BucketResidency)
	if err != nil {
		return nil, err
	}
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sort.Strings(keys)
	out := make([]residency.Observation, 0, len(keys))
	for _, k := range keys {
		var o residency.Observation
		if _, err := bus.GetJSON(ctx, kv, k, &o); err == nil {
			out = append(out, o)
		}
	}
	return out, nil
}
