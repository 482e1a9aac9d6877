// Package lane is the ephemeral lane's manager: it offers the scheduler a
// one-shot execution on a provider's serverless product for a Run that
// allows it, books the Run there when that starts it sooner than any node
// or rental, launches, observes and releases the execution, reconciles a
// launch whose answer was lost, and reports what the execution did as a
// node would, so the Run's events, cost and output read like any Run's.
package lane

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/connhealth"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/schemas"
)

// Connection is one executor account.
type Connection struct {
	ID       string
	Executor ephemeral.Executor
	// OwnershipToken marks every execution launched through it
	// ("warmfleet-<id>" when empty).
	OwnershipToken string
}

// Config configures the lane.
type Config struct {
	Connections []Connection
	// Interval is how often executions are observed (1s).
	Interval time.Duration
	// RentalReady is how long a rented machine takes to start a Run (the
	// rental manager's estimate); the lane must beat it. Zero: no rentals.
	RentalReady time.Duration
	// Margin is how much sooner the lane must start a Run than a node or
	// a rental (the estimates are estimates); 5s when zero.
	Margin time.Duration
	// TTL bounds an execution's whole life on a provider that enforces
	// one, queue included, beyond the Run's max runtime (1h).
	TTL time.Duration
	// LostAnswerAfter is how long a booked attempt may go without its
	// execution's id before the launch is taken as lost (10s).
	LostAnswerAfter time.Duration
	// Timing is the scheduler's: a lane Run is stopped past its start
	// deadline, and past its max runtime plus MaxRuntimeSlack.
	Timing lifecycle.Timing
	// VerifyInterval is how often a connection whose check failed is
	// checked again (1m); until it passes, no Run is sent through it.
	VerifyInterval time.Duration
}

func (c *Config) defaults() {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.Margin == 0 {
		c.Margin = 5 * time.Second
	}
	if c.TTL <= 0 {
		c.TTL = time.Hour
	}
	if c.LostAnswerAfter <= 0 {
		c.LostAnswerAfter = 10 * time.Second
	}
	if c.VerifyInterval <= 0 {
		c.VerifyInterval = time.Minute
	}
	for i := range c.Connections {
		k := &c.Connections[i]
		k.OwnershipToken = capacity.OwnershipTokenFor(k.ID, k.OwnershipToken)
	}
}

// Manager is the lane.
type Manager struct {
	cfg    Config
	health map[string]*connhealth.Health
	conn   *bus.Conn
	cache  *cache.Cache
	runs   *runs.Store
	now    func() time.Time
	log    *zap.Logger
}

// New returns the lane over cfg's connections.
func New(cfg Config, conn *bus.Conn, c *cache.Cache, store *runs.Store, now func() time.Time, log *zap.Logger) (*Manager, error) {
	cfg.defaults()
	seen := map[string]bool{}
	for _, k := range cfg.Connections {
		if k.ID == "" || k.Executor == nil || seen[k.ID] {
			return nil, fmt.Errorf("lane: each connection needs a unique id and an executor")
		}
		if err := k.Executor.Support().Validate(); err != nil {
			return nil, fmt.Errorf("lane: connection %s: %w", k.ID, err)
		}
		seen[k.ID] = true
	}
	return &Manager{cfg: cfg, health: healthOf(cfg.Connections), conn: conn, cache: c, runs: store, now: now, log: log}, nil
}

// Owns reports whether r's attempt is booked on the lane: its steps are
// the lane's, not a node's.
func (m *Manager) Owns(r schemas.Run) bool {
	_, ok := schemas.LaneOf(r.NodeID)
	return ok && r.Phase != schemas.PhaseAccepted
}

// candidate is one lane offer for a Run.
type candidate struct {
	conn  Connection
	offer ephemeral.Offer
	ready float64
}

// Take books r on the lane when it allows the lane and an offer there
// starts it sooner, by Margin, than start (seconds until the best node
// would; +Inf when none takes it now) and than a rental would; it then
// launches the execution. d is the placement decision; the lane is added
// to it as the winning candidate. It reports whether r was booked.
func (m *Manager) Take(ctx context.Context, r schemas.Run, d schemas.BookingDecision, start float64) (bool, error) {
	// An offer ready at once is the best the lane can do; when even that
	// loses, no provider is asked.
	if r.Request.LaneIneligible() != "" || !m.beats(0, start) {
		return false, nil
	}
	best, ok := m.best(ctx, r)
	if !ok {
		return false, nil
	}
	if !m.beats(best.ready, start) {
		return false, nil
	}
	rental := m.rentalReady()
	node := schemas.LaneNodeID(best.conn.ID)
	price := float64(best.offer.PricePerHour.MicrosPerHour) / 1e6
	d.Winner, d.WinnerQueued, d.GPUs, d.FetchFirst = node, false, nil, false
	d.Candidates = append(slices.Clone(d.Candidates), schemas.Candidate{NodeID: node, Eligible: true, Cost: best.ready,
		Detail: fmt.Sprintf("ephemeral lane: %s offer %s starts it in about %.0fs (locality unknown); the best node in %s, a rental in %s",
			best.conn.ID, best.offer.ID, best.ready, seconds(start), seconds(rental)),
		Components: schemas.ScoreComponents{StartSeconds: best.ready, ImageState: string(schemas.LocalityUnknown), PricePerHour: price}})
	booked, err := m.runs.Advance(ctx, r.ID, lifecycle.LaneBooking{Placement: lifecycle.Placement{Decision: d, PricePerHour: price,
		GPUModel: best.offer.GPUModel}, Connection: best.conn.ID, OfferID: best.offer.ID}, false)
	if err != nil {
		return false, err
	}
	m.log.Info("run booked on the ephemeral lane", zap.String("run_id", r.ID), zap.String("connection_id", best.conn.ID),
		zap.String("offer", best.offer.ID), zap.Float64("ready_seconds", best.ready))
	return true, m.launch(ctx, booked, best.conn)
}

// rentalReady is when a rental would start a Run, in seconds (+Inf
// without rentals).
func (m *Manager) rentalReady() float64 {
	if m.cfg.RentalReady > 0 {
		return m.cfg.RentalReady.Seconds()
	}
	return math.Inf(1)
}

// beats reports whether a lane offer ready in ready seconds starts a Run
// sooner, by Margin, than a node starting it in start seconds and than a
// rental.
func (m *Manager) beats(ready, start float64) bool {
	margin := m.cfg.Margin.Seconds()
	return ready+margin < start && ready+margin < m.rentalReady()
}

// best is the soonest offer for r over every connection that passed its
// check, cheaper first on a tie; a connection whose listing fails is left
// out.
func (m *Manager) best(ctx context.Context, r schemas.Run) (candidate, bool) {
	m.verify(ctx, connhealth.Pending)
	var all []candidate
	for _, k := range m.cfg.Connections {
		if !m.health[k.ID].Usable() {
			continue
		}
		offers, err := k.Executor.ListOffers(ctx, ephemeral.OfferQuery{Resources: r.Request.Resources, GPU: r.Request.GPU, Image: r.Request.Image})
		if err != nil {
			m.log.Warn("lane offers", zap.String("connection_id", k.ID), zap.Error(err))
			continue
		}
		for _, o := range offers {
			if !o.Available || (o.MaxRuntimeSeconds > 0 && r.Request.MaxRuntimeSeconds > o.MaxRuntimeSeconds) {
				continue
			}
			all = append(all, candidate{conn: k, offer: o, ready: float64(max(o.ReadySeconds, 0))})
		}
	}
	if len(all) == 0 {
		return candidate{}, false
	}
	return slices.MinFunc(all, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.ready, b.ready), cmp.Compare(a.offer.PricePerHour.MicrosPerHour, b.offer.PricePerHour.MicrosPerHour),
			cmp.Compare(a.conn.ID, b.conn.ID), cmp.Compare(a.offer.ID, b.offer.ID))
	}), true
}

func seconds(s float64) string {
	if math.IsInf(s, 1) {
		return "never"
	}
	return fmt.Sprintf("%.0fs", s)
}

// connection is the connection a booked Run's execution went through.
func (m *Manager) connection(r schemas.Run) (Connection, bool) {
	if r.Execution == nil {
		return Connection{}, false
	}
	i := slices.IndexFunc(m.cfg.Connections, func(k Connection) bool { return k.ID == r.Execution.Connection })
	if i < 0 {
		return Connection{}, false
	}
	return m.cfg.Connections[i], true
}
