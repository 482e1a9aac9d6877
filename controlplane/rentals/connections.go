package rentals

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/schemas"
)

// Connection is one provider account the control plane rents from. Its
// rentals, its janitor and its ownership token are its own; offers are
// compared across every connection that verified.
type Connection struct {
	ID       string
	Provider capacity.Provider
	// OwnershipToken marks every machine rented through it; the janitor
	// touches only machines carrying it ("warmfleet-<id>" when empty).
	OwnershipToken string
	// MaxRentals bounds its machines at once (0: only Config.MaxRentals).
	MaxRentals int
}

// conn is a Connection with its health, as this replica last verified it.
type conn struct {
	Connection
	typ string

	mu         sync.Mutex
	state      string
	err        string
	verifiedAt time.Time
}

func newConn(c Connection) *conn {
	if c.OwnershipToken == "" {
		c.OwnershipToken = "warmfleet-" + c.ID
	}
	typ := "unknown"
	if d, ok := c.Provider.(capacity.Declarer); ok {
		typ = d.Declaration().Type
	}
	return &conn{Connection: c, typ: typ, state: schemas.ConnectionPending}
}

// usable reports whether the connection's last Verify succeeded.
func (c *conn) usable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == schemas.ConnectionOK
}

// verify runs the provider's Verify and records the outcome.
func (c *conn) verify(ctx context.Context, now time.Time, log *zap.Logger) {
	vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := c.Provider.Verify(vctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	was := c.state
	c.verifiedAt = now
	if err != nil {
		c.state, c.err = schemas.ConnectionFailed, err.Error()
		if was != schemas.ConnectionFailed {
			log.Warn("provider connection failed its check; skipped until it passes", zap.String("connection_id", c.ID), zap.String("type", c.typ), zap.Error(err))
		}
		return
	}
	c.state, c.err = schemas.ConnectionOK, ""
	if was != schemas.ConnectionOK {
		log.Info("provider connection verified", zap.String("connection_id", c.ID), zap.String("type", c.typ))
	}
}

// status is the connection as operators see it, with live rentals counted
// from rentals.
func (c *conn) status(rentals []schemas.Rental) schemas.ConnectionStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return schemas.ConnectionStatus{ID: c.ID, Type: c.typ, State: c.state, Error: c.err, VerifiedAt: c.verifiedAt,
		Live: liveOn(rentals, c.ID), MaxRentals: c.MaxRentals}
}

// atLimit reports whether the connection holds as many machines as it may.
func (c *conn) atLimit(rentals []schemas.Rental) bool {
	return c.MaxRentals > 0 && liveOn(rentals, c.ID) >= c.MaxRentals
}

// connections are a Manager's, by id.
type connections struct {
	byID  map[string]*conn
	order []*conn // by id
}

func newConnections(cs []Connection) (connections, error) {
	out := connections{byID: map[string]*conn{}}
	for _, c := range cs {
		if c.ID == "" || c.Provider == nil {
			return connections{}, fmt.Errorf("rentals: a connection needs an id and a provider")
		}
		if _, dup := out.byID[c.ID]; dup {
			return connections{}, fmt.Errorf("rentals: connection %q is named twice", c.ID)
		}
		k := newConn(c)
		out.byID[c.ID] = k
		out.order = append(out.order, k)
	}
	slices.SortFunc(out.order, func(a, b *conn) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// of is the connection a rental was made through; false when this control
// plane no longer has it configured.
func (cs connections) of(rt schemas.Rental) (*conn, bool) {
	c, ok := cs.byID[cmp.Or(rt.ConnectionID, "default")]
	return c, ok
}

// usable are the verified connections, by id.
func (cs connections) usable() []*conn {
	var out []*conn
	for _, c := range cs.order {
		if c.usable() {
			out = append(out, c)
		}
	}
	return out
}

// ready verifies the connections not yet checked, then returns the usable
// ones, by id.
func (cs connections) ready(ctx context.Context, now time.Time, log *zap.Logger) []*conn {
	for _, c := range cs.order {
		c.mu.Lock()
		pending := c.state == schemas.ConnectionPending
		c.mu.Unlock()
		if pending {
			c.verify(ctx, now, log)
		}
	}
	return cs.usable()
}

// verify checks every connection (all: true) or only those not verified
// ok.
func (cs connections) verify(ctx context.Context, all bool, now time.Time, log *zap.Logger) {
	for _, c := range cs.order {
		if all || !c.usable() {
			c.verify(ctx, now, log)
		}
	}
}

// liveOn counts connection id's rentals that hold a machine.
func liveOn(rentals []schemas.Rental, id string) int {
	n := 0
	for _, rt := range rentals {
		if !rt.State.Done() && cmp.Or(rt.ConnectionID, "default") == id {
			n++
		}
	}
	return n
}
