package rentals

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/controlplane/connhealth"
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
	health *connhealth.Health
}

func newConn(c Connection) *conn {
	c.OwnershipToken = capacity.OwnershipTokenFor(c.ID, c.OwnershipToken)
	return &conn{Connection: c, health: connhealth.New(c.ID, capacity.TypeOf(c.Provider))}
}

// usable reports whether the connection's last Verify succeeded.
func (c *conn) usable() bool { return c.health.Usable() }

// status is the connection as operators see it, with live rentals counted
// from rentals.
func (c *conn) status(rentals []schemas.Rental) schemas.ConnectionStatus {
	st := c.health.Status()
	st.Live, st.MaxRentals = liveOn(rentals, c.ID), c.MaxRentals
	return st
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

// defaultConnection is the id of the one connection Config's shorthand
// (Provider) makes, and of a rental recorded before connections had ids.
const defaultConnection = "default"

// connectionOf is the id of the connection rt was made through.
func connectionOf(rt schemas.Rental) string { return cmp.Or(rt.ConnectionID, defaultConnection) }

// of is the connection a rental was made through; false when this control
// plane no longer has it configured.
func (cs connections) of(rt schemas.Rental) (*conn, bool) {
	c, ok := cs.byID[connectionOf(rt)]
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
	cs.verify(ctx, connhealth.Pending, now, log)
	return cs.usable()
}

// verify checks the connections whose current state which selects.
func (cs connections) verify(ctx context.Context, which func(state string) bool, now time.Time, log *zap.Logger) {
	for _, c := range cs.order {
		if which(c.health.State()) {
			c.health.Verify(ctx, c.Provider.Verify, now, log)
		}
	}
}

// liveOn counts connection id's rentals that hold a machine.
func liveOn(rentals []schemas.Rental, id string) int {
	n := 0
	for _, rt := range rentals {
		if !rt.State.Done() && connectionOf(rt) == id {
			n++
		}
	}
	return n
}
