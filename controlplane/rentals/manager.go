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

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/requests"
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
	conns     connections
	market    *market
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
func New(cfg Config, pc placement.Config, conn *bus.Conn, rentalsKV, nodesKV jetstream.KeyValue, c *cache.Cache, store *runs.Store, inviter Inviter, now func() time.Time, log *zap.Logger) (*Manager, error) {
	cfg.Defaults()
	conns, err := newConnections(cfg.Connections)
	if err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, conns: conns, placement: pc, conn: conn, nodesKV: nodesKV, store: newStore(rentalsKV, now), cache: c, runs: store, inviter: inviter, now: now, log: log}
	m.market = &market{cfg: &m.cfg, placement: pc, conns: conns, now: now, log: log}
	return m, nil
}

// Connections reports each provider connection as this replica sees it.
func (m *Manager) Connections() []schemas.ConnectionStatus {
	rentals := m.store.list()
	out := make([]schemas.ConnectionStatus, 0, len(m.conns.order))
	for _, c := range m.conns.order {
		out = append(out, c.status(rentals))
	}
	return out
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
	stopRetire, err := requests.Serve(ctx, &m.wg, m.conn.NC, requests.Coded(bus.SubjectRetire, "body is not an AdminRequest",
		func(r *schemas.AdminRequest) error {
			return schemas.ValidateID("rental_id", r.ID, schemas.CodeMalformed)
		}, m.askRetire, m.log))
	if err != nil {
		cancel()
		m.wg.Wait()
		return nil, err
	}
	return func() { stopRetire(); cancel(); m.wg.Wait() }, nil
}

// leading reports whether this replica runs the rental loop now.
func (m *Manager) leading() bool {
	l := m.leader.Load()
	return l != nil && l.leading()
}

// askRetire asks for a rental to be retired once its node is idle
// (wf.admin.rental.retire).
func (m *Manager) askRetire(ctx context.Context, _ string, req schemas.AdminRequest) (schemas.Rental, error) {
	err := m.store.update(ctx, req.ID, func(s *schemas.Rental, now time.Time) error {
		if s.State != schemas.RentalReady {
			return &schemas.Refusal{Code: schemas.CodeMalformed, Field: "id", Reason: "only a ready rental can be retired; it is " + string(s.State)}
		}
		return setRentalState(s, schemas.RentalDraining, time.Time{}, now)
	})
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return schemas.Rental{}, &schemas.Refusal{Code: schemas.CodeMalformed, Field: "id", Reason: "no rental " + req.ID + "; `warmfleet rental list` shows them"}
	}
	if err != nil {
		return schemas.Rental{}, err
	}
	var rt schemas.Rental
	_, _ = bus.GetJSON(ctx, m.store.kv, req.ID, &rt)
	return rt, nil
}
