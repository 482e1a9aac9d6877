package residency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// Residency service operations an agent asks the control plane for, on
// wf.node.<id>.residency.<op>. Only the control plane writes KV (an
// agent's permissions, bus.PermsNode in bus/auth.go, grant no KV), so a host
// in an agent reaches wf_leases, wf_residency and wf_sessions through these. The node id in the subject is the caller: an agent may
// publish only its own wf.node.<id>.>, and the service refuses a lease,
// route or checkpoint whose holder is another node.
const (
	svcLeaseAcquire    = "lease_acquire"
	svcLeaseRenew      = "lease_renew"
	svcLeaseRelease    = "lease_release"
	svcRoutePublish    = "route_publish"
	svcRouteTombstone  = "route_tombstone"
	svcStateLoad       = "state_load"
	svcStateCheckpoint = "state_checkpoint"
)

type keyBody struct {
	Key Key `json:"key"`
	// Token makes a lease acquire idempotent (see
	// KVLeases.AcquireSessionLeaseToken).
	Token string `json:"token,omitempty"`
}

type tombstoneBody struct {
	Key   Key            `json:"key"`
	Epoch ResidencyEpoch `json:"epoch"`
}

type svcReply struct {
	OK    json.RawMessage       `json:"ok,omitempty"`
	Error *schemas.SessionError `json:"error,omitempty"`
}

// Services are the control plane's residency stores a Service serves.
type Services struct {
	Leases    *KVLeases
	Locations *KVLocations
	Sessions  *KVSessions
}

// Service answers agents' residency requests. Serve subscribes; the stop
// function it returns unsubscribes.
type Service struct {
	s       Services
	log     *zap.Logger
	timeout time.Duration
}

// NewService returns a Service over s.
func NewService(s Services, log *zap.Logger) (*Service, error) {
	if s.Leases == nil || s.Locations == nil || s.Sessions == nil {
		return nil, &InvalidOptionsError{Field: "Services", Reason: "leases, locations and sessions are all required"}
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Service{s: s, log: log.Named("residency-service"), timeout: DefaultRequestTimeout}, nil
}

// Serve subscribes to every node's residency requests in queue group,
// spread over control-plane replicas. Each request is answered on its own
// goroutine (at most maxInFlight at once), so one slow store write does not
// hold up every node's renewals; the returned stop unsubscribes and waits
// for those in flight. Handlers run under ctx.
func (v *Service) Serve(ctx context.Context, nc *nats.Conn, queue string) (func(), error) {
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxInFlight)
	sub, err := nc.QueueSubscribe(bus.SubjectResidencyServiceAll, queue, func(m *nats.Msg) {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-slots }()
			v.handle(ctx, m)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("residency: subscribe %s: %w", bus.SubjectResidencyServiceAll, err)
	}
	return func() {
		_ = sub.Unsubscribe()
		wg.Wait()
	}, nil
}

// maxInFlight bounds the residency requests one Service answers at once.
const maxInFlight = 64

// handle answers one request. The subject is wf.node.<id>.residency.<op>.
func (v *Service) handle(ctx context.Context, m *nats.Msg) {
	parts := strings.Split(m.Subject, ".")
	if len(parts) != 5 || m.Reply == "" {
		return
	}
	node, op := parts[2], parts[4]
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	ok, err := v.do(ctx, node, op, m.Data)
	rep := svcReply{Error: ToWire(err)}
	if err == nil && ok != nil {
		b, merr := json.Marshal(ok)
		if merr != nil {
			rep.Error = ToWire(merr)
		} else {
			rep.OK = b
		}
	}
	if err != nil {
		v.log.Debug("residency request refused", zap.String("node_id", node), zap.String("op", op), zap.Error(err))
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return
	}
	_ = m.RespondMsg(&nats.Msg{Subject: m.Reply, Data: b, Header: nats.Header{"Content-Type": []string{"application/json"}}})
}

func decodeBody(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: body: %v", ErrInvalidRequest, err)
	}
	return nil
}

func notYours(node, what, owner string) error {
	return fmt.Errorf("%w: node %s may not act on %s of %q", ErrForbidden, node, what, owner)
}

func (v *Service) do(ctx context.Context, node, op string, data []byte) (any, error) {
	switch op {
	case svcLeaseAcquire:
		var b keyBody
		if err := decodeBody(data, &b); err != nil {
			return nil, err
		}
		if b.Token == "" {
			return v.s.Leases.AcquireSessionLease(ctx, b.Key, node)
		}
		return v.s.Leases.AcquireSessionLeaseToken(ctx, b.Key, node, b.Token)
	case svcLeaseRenew, svcLeaseRelease:
		var g LeaseGrant
		if err := decodeBody(data, &g); err != nil {
			return nil, err
		}
		if g.Holder != node {
			return nil, notYours(node, "the lease", g.Holder)
		}
		if op == svcLeaseRenew {
			return v.s.Leases.RenewSessionLease(ctx, g)
		}
		return struct{}{}, v.s.Leases.ReleaseSessionLease(ctx, g)
	case svcRoutePublish:
		var o Observation
		if err := decodeBody(data, &o); err != nil {
			return nil, err
		}
		if o.Host != node {
			return nil, notYours(node, "the route", o.Host)
		}
		return struct{}{}, v.s.Locations.PublishResidency(ctx, o)
	case svcRouteTombstone:
		var b tombstoneBody
		if err := decodeBody(data, &b); err != nil {
			return nil, err
		}
		return struct{}{}, v.s.Locations.TombstoneResidency(ctx, b.Key, node, b.Epoch)
	case svcStateLoad:
		var b keyBody
		if err := decodeBody(data, &b); err != nil {
			return nil, err
		}
		return v.s.Sessions.LoadSessionState(ctx, b.Key)
	case svcStateCheckpoint:
		var c Checkpoint
		if err := decodeBody(data, &c); err != nil {
			return nil, err
		}
		if c.Host != node {
			return nil, notYours(node, "the checkpoint", c.Host)
		}
		return struct{}{}, v.s.Sessions.CommitCheckpoint(ctx, c)
	default:
		return nil, fmt.Errorf("%w: unknown residency operation %q", ErrInvalidRequest, op)
	}
}

// Remote is a host's view of the control plane's residency services over
// request/reply: it implements SessionLeases, Locations and DurableStore for
// a Manager inside an agent. A transport failure is returned as is (never as
// ErrLeaseLost), so a lease rides out a lost reply to its local deadline.
type Remote struct {
	NC      *nats.Conn
	NodeID  string
	Timeout time.Duration // DefaultRequestTimeout when zero
}

var (
	_ SessionLeases = (*Remote)(nil)
	_ Locations     = (*Remote)(nil)
	_ DurableStore  = (*Remote)(nil)
)

// ErrServiceUnavailable: no control plane answered a residency request.
var ErrServiceUnavailable = errors.New("residency: control plane residency service unavailable")

func (r *Remote) call(ctx context.Context, op string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	t := r.Timeout
	if t <= 0 {
		t = DefaultRequestTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	msg := &nats.Msg{Subject: bus.NodeResidencyService(r.NodeID, op), Data: b, Header: nats.Header{"Content-Type": []string{"application/json"}}}
	resp, err := r.NC.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrServiceUnavailable, op, err)
	}
	var rep svcReply
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		return fmt.Errorf("%w: %s: malformed reply: %w", ErrServiceUnavailable, op, err)
	}
	if rep.Error != nil {
		return ErrorFromWire(rep.Error)
	}
	if out != nil && len(rep.OK) > 0 {
		if err := json.Unmarshal(rep.OK, out); err != nil {
			return fmt.Errorf("%w: %s: malformed reply: %w", ErrServiceUnavailable, op, err)
		}
	}
	return nil
}

// AcquireSessionLease implements SessionLeases; the holder is this node.
func (r *Remote) AcquireSessionLease(ctx context.Context, key Key, holder string) (LeaseGrant, error) {
	if holder != r.NodeID {
		return LeaseGrant{}, notYours(r.NodeID, "a lease", holder)
	}
	token := newToken()
	// A request whose answer was lost may still have granted the lease:
	// asking again under the same token gets that grant back instead of
	// ErrLeaseHeld against ourselves until it expires.
	var g LeaseGrant
	for attempt := 0; ; attempt++ {
		err := r.call(ctx, svcLeaseAcquire, keyBody{Key: key, Token: token}, &g)
		if attempt >= 1 || !errors.Is(err, ErrServiceUnavailable) || ctx.Err() != nil {
			return g, err
		}
	}
}

// RenewSessionLease implements SessionLeases.
func (r *Remote) RenewSessionLease(ctx context.Context, g LeaseGrant) (LeaseGrant, error) {
	var ng LeaseGrant
	err := r.call(ctx, svcLeaseRenew, g, &ng)
	return ng, err
}

// ReleaseSessionLease implements SessionLeases.
func (r *Remote) ReleaseSessionLease(ctx context.Context, g LeaseGrant) error {
	return r.call(ctx, svcLeaseRelease, g, nil)
}

// PublishResidency implements Locations.
func (r *Remote) PublishResidency(ctx context.Context, obs Observation) error {
	return r.call(ctx, svcRoutePublish, obs, nil)
}

// TombstoneResidency implements Locations; the host is this node.
func (r *Remote) TombstoneResidency(ctx context.Context, key Key, host string, epoch ResidencyEpoch) error {
	if host != r.NodeID {
		return notYours(r.NodeID, "a route", host)
	}
	return r.call(ctx, svcRouteTombstone, tombstoneBody{Key: key, Epoch: epoch}, nil)
}

// LoadSessionState implements DurableStore.
func (r *Remote) LoadSessionState(ctx context.Context, key Key) (SessionState, error) {
	var st SessionState
	err := r.call(ctx, svcStateLoad, keyBody{Key: key}, &st)
	return st, err
}

// CommitCheckpoint implements DurableStore.
func (r *Remote) CommitCheckpoint(ctx context.Context, cp Checkpoint) error {
	return r.call(ctx, svcStateCheckpoint, cp, nil)
}
