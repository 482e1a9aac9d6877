// Package rentals is the rental manager: it rents machines from a capacity
// provider when no node fits a Run (or every node that fits is busy and a
// fresh machine starts it sooner), drives each rental through its
// lifecycle from what the provider and the rental's node report, retires
// idle ones, and has a janitor terminate what belongs to no rental. One
// replica, the holder of a leader lease in wf_leases, makes every provider
// call.
package rentals

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/schemas"
)

// Inviter mints a rented machine's bootstrap: a single-use enrollment
// token for its node.
type Inviter interface {
	Invite(ctx context.Context, req schemas.InviteRequest) (schemas.NodeBootstrap, error)
}

// Manager rents and drives machines.
type Manager struct {
	cfg       Config
	placement placement.Config
	conn      *bus.Conn
	nodesKV   jetstream.KeyValue
	store     *store
	cache     *cache.Cache
	runs      *runs.Store
	inviter   Inviter
	now       func() time.Time
	log       *zap.Logger

	// leader is the rental loop's election; nil until Run opens it.
	leader atomic.Pointer[leaderLease]
	// wg owns the store's watch.
	wg sync.WaitGroup
}

// New returns a manager for cfg (defaults applied) over wf_rentals; pc
// gives the image pull estimates the rent-or-queue policy uses.
func New(cfg Config, pc placement.Config, conn *bus.Conn, rentalsKV, nodesKV jetstream.KeyValue, c *cache.Cache, store *runs.Store, inviter Inviter, now func() time.Time, log *zap.Logger) *Manager {
	cfg.Defaults()
	return &Manager{cfg: cfg, placement: pc, conn: conn, nodesKV: nodesKV, store: newStore(rentalsKV, now), cache: c, runs: store, inviter: inviter, now: now, log: log}
}

// Serve loads the rentals and answers operators' retire requests until
// stop is called.
func (m *Manager) Serve(ctx context.Context) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	if err := m.store.start(ctx, &m.wg); err != nil {
		cancel()
		m.wg.Wait()
		return nil, err
	}
	subs, err := bus.QueueSubscribeAll(m.conn.NC, map[string]nats.MsgHandler{
		bus.SubjectRetire: func(msg *nats.Msg) { m.handleRetire(ctx, msg) },
	})
	if err != nil {
		cancel()
		m.wg.Wait()
		return nil, err
	}
	return func() { subs.Stop(); cancel(); m.wg.Wait() }, nil
}

// leading reports whether this replica runs the rental loop now.
func (m *Manager) leading() bool {
	l := m.leader.Load()
	return l != nil && l.leading()
}

// handleRetire asks for a rental to be retired once its node is idle.
func (m *Manager) handleRetire(ctx context.Context, msg *nats.Msg) {
	var req schemas.AdminRequest
	enc, err := codec.DecodeMsg(msg, &req)
	if err == nil {
		err = schemas.ValidateID("rental_id", req.ID, schemas.CodeMalformed)
	}
	if err != nil {
		m.respond(msg, enc, schemas.Reply[schemas.Rental]{Refusal: schemas.RefusalOfInput(err, "body is not an AdminRequest")})
		return
	}
	err = m.store.update(ctx, req.ID, func(s *schemas.Rental, now time.Time) error {
		if s.State != schemas.RentalReady {
			return &schemas.Refusal{Code: schemas.CodeMalformed, Field: "id", Reason: "only a ready rental can be retired; it is " + string(s.State)}
		}
		return setRentalState(s, schemas.RentalDraining, time.Time{}, now)
	})
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		err = &schemas.Refusal{Code: schemas.CodeMalformed, Field: "id", Reason: "no rental " + req.ID + "; `warmfleet rental list` shows them"}
	}
	if err != nil {
		m.respond(msg, enc, schemas.Reply[schemas.Rental]{Refusal: schemas.AsRefusal(err)})
		return
	}
	var rt schemas.Rental
	_, _ = bus.GetJSON(ctx, m.store.kv, req.ID, &rt)
	m.respond(msg, enc, schemas.Reply[schemas.Rental]{OK: &rt})
}

func (m *Manager) respond(msg *nats.Msg, enc codec.Encoding, v any) {
	if err := bus.Respond(msg, enc, v); err != nil {
		m.log.Error("reply", zap.String("subject", msg.Subject), zap.Error(err))
	}
}
