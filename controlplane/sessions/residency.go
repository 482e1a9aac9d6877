package sessions

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// The residency stores served to agents. Only the control plane writes KV
// (an agent's permissions, bus.PermsNode, grant none), so a session host
// (residency.Remote) reaches wf_leases, wf_residency and wf_sessions through
// these operations, one request server each, on wf.node.<id>.residency.<op>.
// The node id in the subject is the caller: an agent may publish only its
// own wf.node.<id>.>, and a lease, route or checkpoint whose holder is
// another node is refused. Beyond that, the stores write only for the
// lease's holder at exactly its epoch (residency.ErrNotLeaseHolder), and a
// lease is granted only on a session an attach placed on the node
// (placement.go, residency.ErrNotPlaced).

// maxInFlight bounds the requests of one operation answered at once, over
// every node, so a slow store write holds up neither the next request nor
// another operation (a renewal waits on no checkpoint).
const maxInFlight = 64

// residencyEndpoints are the residency operations, each served over st.
func (st *stores) residencyEndpoints(log *zap.Logger) []requests.Endpoint {
	return []requests.Endpoint{
		residencyServer(schemas.ResidencyLeaseAcquire, "ResidencyKeyRequest", st.acquireLease, log),
		residencyServer(schemas.ResidencyLeaseRenew, "SessionLeaseGrant", st.renewLease, log),
		residencyServer(schemas.ResidencyLeaseRelease, "SessionLeaseGrant", st.releaseLease, log),
		residencyServer(schemas.ResidencyRoutePublish, "ResidencyObservation", st.publishRoute, log),
		residencyServer(schemas.ResidencyRouteTombstone, "ResidencyTombstoneRequest", st.tombstoneRoute, log),
		residencyServer(schemas.ResidencyStateLoad, "ResidencyKeyRequest", st.loadState, log),
		residencyServer(schemas.ResidencyStateCheckpoint, "SessionCheckpoint", st.commitCheckpoint, log),
	}
}

// residencyServer serves op from every node: answer gets the node id in the
// subject and runs under residency.DefaultRequestTimeout; the reply is
// JSON, its error the session protocol's, whose code the agent's side
// matches to the same sentinel (residency.ErrorFromWire). A body that does
// not decode as a T is refused residency.ErrInvalidRequest.
func residencyServer[T, R any, PT validated[T]](op schemas.ResidencyOp, body string, answer func(ctx context.Context, node string, req T) (R, error), log *zap.Logger) *requests.Server[T, schemas.ResidencyReply[R]] {
	return residencyServerIn[T, R, PT](op, body, true, answer, log)
}

// residencyServerIn is residencyServer answering in JSON when json is set,
// else in the request's own encoding (a checkpoint's msgpack, whose chunk
// bytes JSON would grow by a third).
func residencyServerIn[T, R any, PT validated[T]](op schemas.ResidencyOp, body string, json bool, answer func(ctx context.Context, node string, req T) (R, error), log *zap.Logger) *requests.Server[T, schemas.ResidencyReply[R]] {
	malformed := "body is not a " + body
	return &requests.Server[T, schemas.ResidencyReply[R]]{
		Subject: bus.NodeResidencyService("*", string(op)), What: "residency request", Malformed: malformed, JSON: json, Log: log,
		Validate: func(req *T) error { return PT(req).Validate() },
		Pool:     keyed.PoolOptions{Workers: maxInFlight, Queue: 4 * maxInFlight},
		Answer: func(ctx context.Context, subject string, req T) schemas.ResidencyReply[R] {
			node := bus.ResidencyServiceNode(subject)
			ctx, cancel := context.WithTimeout(ctx, residency.DefaultRequestTimeout)
			defer cancel()
			r, err := answer(ctx, node, req)
			if err != nil {
				log.Debug("residency request refused", zap.String("node_id", node), zap.String("op", string(op)), zap.Error(err))
				return schemas.ResidencyReply[R]{Error: residency.ToWire(err)}
			}
			return schemas.ResidencyReply[R]{OK: &r}
		},
		Refuse: func(_ *schemas.Refusal, err error) schemas.ResidencyReply[R] {
			return schemas.ResidencyReply[R]{Error: residency.ToWire(fmt.Errorf("%w: %s: %v", residency.ErrInvalidRequest, malformed, err))}
		},
	}
}

// validated is a residency body that bounds itself (schemas.CheckNodeSizes):
// every operation's body must be one.
type validated[T any] interface {
	*T
	Validate() error
}

// none is the answer of an operation that has no result: {"ok":{}}.
type none = struct{}

// acquireLease grants node the lease of a session an attach placed on it
// (placements.check), and of no other.
func (st *stores) acquireLease(ctx context.Context, node string, req schemas.ResidencyKeyRequest) (residency.LeaseGrant, error) {
	if err := residency.KeyOf(req.Key).Validate(); err != nil {
		return residency.LeaseGrant{}, err
	}
	if err := st.placements.check(ctx, residency.KeyOf(req.Key), node); err != nil {
		return residency.LeaseGrant{}, err
	}
	var (
		g   residency.LeaseGrant
		err error
	)
	if req.Token == "" {
		g, err = st.leases.AcquireSessionLease(ctx, residency.KeyOf(req.Key), node)
	} else {
		g, err = st.leases.AcquireSessionLeaseToken(ctx, residency.KeyOf(req.Key), node, req.Token)
	}
	// A grant the acquire could not undo is given back here, where it was
	// made; the node, told only that the acquire failed, gives back under
	// its token what this could not.
	var owed *residency.LeaseCleanupError
	if errors.As(err, &owed) {
		if cerr := owed.Release(ctx); cerr != nil {
			return g, errors.Join(owed.Cause, fmt.Errorf("give back the lease: %w", cerr))
		}
		return g, owed.Cause
	}
	return g, err
}

func (st *stores) renewLease(ctx context.Context, node string, g residency.LeaseGrant) (residency.LeaseGrant, error) {
	if g.Holder != node {
		return residency.LeaseGrant{}, residency.NotHolder(node, "the lease", g.Holder)
	}
	return st.leases.RenewSessionLease(ctx, g)
}

func (st *stores) releaseLease(ctx context.Context, node string, g residency.LeaseGrant) (none, error) {
	if g.Holder != node {
		return none{}, residency.NotHolder(node, "the lease", g.Holder)
	}
	return none{}, st.leases.ReleaseSessionLease(ctx, g)
}

func (st *stores) publishRoute(ctx context.Context, node string, o schemas.ResidencyObservation) (none, error) {
	if o.Host != node {
		return none{}, residency.NotHolder(node, "the route", o.Host)
	}
	return none{}, st.locations.PublishResidency(ctx, residency.Observation(o))
}

// tombstoneRoute tombstones the route as the subject's node: another node's
// epoch is refused by the store (residency.ErrEpochSuperseded).
func (st *stores) tombstoneRoute(ctx context.Context, node string, req schemas.ResidencyTombstoneRequest) (none, error) {
	return none{}, st.locations.TombstoneResidency(ctx, residency.KeyOf(req.Key), node, req.Epoch)
}

// loadState answers the session's lease holder only: an attach loads after
// it acquired the lease, and a session's state is no other node's to read.
func (st *stores) loadState(ctx context.Context, node string, req schemas.ResidencyKeyRequest) (residency.SessionState, error) {
	key := residency.KeyOf(req.Key)
	if err := key.Validate(); err != nil {
		return residency.SessionState{}, err
	}
	rec, _, err := st.leases.Get(ctx, key)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return residency.SessionState{}, err
	}
	if err != nil || rec.Holder != node || rec.Released {
		return residency.SessionState{}, fmt.Errorf("%w: node %s holds no lease on %s: load its state after acquiring the lease", residency.ErrNotLeaseHolder, node, key)
	}
	return st.durable.LoadSessionState(ctx, key)
}

func (st *stores) commitCheckpoint(ctx context.Context, node string, cp residency.Checkpoint) (none, error) {
	if cp.Host != node {
		return none{}, residency.NotHolder(node, "the checkpoint", cp.Host)
	}
	if err := st.durable.CommitCheckpoint(ctx, cp); err != nil {
		return none{}, err
	}
	st.events.checkpointed(ctx, cp)
	return none{}, nil
}
