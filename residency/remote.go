package residency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// NotHolder is the refusal of node acting on what (a lease, a route, a
// checkpoint) of holder, another node: the node id in a residency request's
// subject is the caller, and it may act only on its own.
func NotHolder(node, what, holder string) error {
	return fmt.Errorf("%w: node %s may not act on %s of %q", ErrForbidden, node, what, holder)
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

// call asks the control plane for op on this node's subject and returns
// its answer, or the error its reply carried (matching its sentinel).
func call[R any](ctx context.Context, r *Remote, op schemas.ResidencyOp, body any) (R, error) {
	return callIn[R](ctx, r, op, body, codec.JSON)
}

// callIn is call with the body in enc; the answer comes in the encoding
// the control plane chose, which its Content-Type names.
func callIn[R any](ctx context.Context, r *Remote, op schemas.ResidencyOp, body any, enc codec.Encoding) (R, error) {
	var out R
	b, err := codec.Encode(enc, body)
	if err != nil {
		return out, err
	}
	t := r.Timeout
	if t <= 0 {
		t = DefaultRequestTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	msg := &nats.Msg{Subject: bus.NodeResidencyService(r.NodeID, string(op)), Data: b, Header: nats.Header{codec.ContentTypeHeader: []string{enc.ContentType()}}}
	resp, err := r.NC.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return out, fmt.Errorf("%w: %s: %w", ErrServiceUnavailable, op, err)
	}
	var rep schemas.ResidencyReply[R]
	if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, &rep); err != nil {
		return out, fmt.Errorf("%w: %s: malformed reply: %w", ErrServiceUnavailable, op, err)
	}
	if rep.Error != nil {
		return out, ErrorFromWire(rep.Error)
	}
	if rep.OK != nil {
		out = *rep.OK
	}
	return out, nil
}

// AcquireSessionLease implements SessionLeases; the holder is this node.
func (r *Remote) AcquireSessionLease(ctx context.Context, key Key, holder string) (LeaseGrant, error) {
	if holder != r.NodeID {
		return LeaseGrant{}, NotHolder(r.NodeID, "a lease", holder)
	}
	body := schemas.ResidencyKeyRequest{Key: WireKey(key), Token: newToken()}
	// A request whose answer was lost may still have granted the lease:
	// asking again under the same token gets that grant back instead of
	// ErrLeaseHeld against ourselves until it expires. If that answer is
	// lost too, or the service failed without naming a refusal, the error
	// is a *LeaseCleanupError whose cleanup gives the grant back.
	for attempt := 0; ; attempt++ {
		g, err := call[LeaseGrant](ctx, r, schemas.ResidencyLeaseAcquire, body)
		if err == nil {
			return g, nil
		}
		if attempt >= 1 || !errors.Is(err, ErrServiceUnavailable) || ctx.Err() != nil {
			if _, refused := codeOf(err); refused {
				return g, err // a refusal the service named: nothing granted
			}
			return g, &LeaseCleanupError{Cause: err, Cleanup: func(ctx context.Context) error { return r.giveBack(ctx, body) }}
		}
	}
}

// giveBack releases whatever an acquire under body's token was granted:
// asking again under the token returns that grant, which is then released.
// A lease held by anyone else, or no longer placed here, is nothing of ours.
func (r *Remote) giveBack(ctx context.Context, body schemas.ResidencyKeyRequest) error {
	g, err := call[LeaseGrant](ctx, r, schemas.ResidencyLeaseAcquire, body)
	switch {
	case errors.Is(err, ErrLeaseHeld), errors.Is(err, ErrNotPlaced):
		return nil
	case err != nil:
		return fmt.Errorf("residency: give back the lease of %s: %w", KeyOf(body.Key), err)
	}
	return r.ReleaseSessionLease(ctx, g)
}

// RenewSessionLease implements SessionLeases.
func (r *Remote) RenewSessionLease(ctx context.Context, g LeaseGrant) (LeaseGrant, error) {
	return call[LeaseGrant](ctx, r, schemas.ResidencyLeaseRenew, g)
}

// ReleaseSessionLease implements SessionLeases.
func (r *Remote) ReleaseSessionLease(ctx context.Context, g LeaseGrant) error {
	_, err := call[struct{}](ctx, r, schemas.ResidencyLeaseRelease, g)
	return err
}

// PublishResidency implements Locations.
func (r *Remote) PublishResidency(ctx context.Context, obs Observation) error {
	_, err := call[struct{}](ctx, r, schemas.ResidencyRoutePublish, schemas.ResidencyObservation(obs))
	return err
}

// TombstoneResidency implements Locations; the host is this node.
func (r *Remote) TombstoneResidency(ctx context.Context, key Key, host string, epoch ResidencyEpoch) error {
	if host != r.NodeID {
		return NotHolder(r.NodeID, "a route", host)
	}
	_, err := call[struct{}](ctx, r, schemas.ResidencyRouteTombstone, schemas.ResidencyTombstoneRequest{Key: WireKey(key), Epoch: epoch})
	return err
}

// LoadSessionState implements DurableStore.
func (r *Remote) LoadSessionState(ctx context.Context, key Key) (SessionState, error) {
	return call[SessionState](ctx, r, schemas.ResidencyStateLoad, schemas.ResidencyKeyRequest{Key: WireKey(key)})
}

// CommitCheckpoint implements DurableStore.
func (r *Remote) CommitCheckpoint(ctx context.Context, cp Checkpoint) error {
	_, err := call[struct{}](ctx, r, schemas.ResidencyStateCheckpoint, cp)
	return err
}
