package rentals

import (
	"errors"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// Config lets the control plane rent machines when no node fits.
type Config struct {
	// Connections are the provider accounts to rent from (connections.go).
	Connections []Connection
	// Provider, ConnectionID and OwnershipToken are a shorthand for one
	// connection, used when Connections is empty.
	Provider     capacity.Provider
	ConnectionID string
	// OwnershipToken marks every machine this deployment rents, so the
	// janitor never touches a machine that merely resembles ours.
	OwnershipToken string
	// MaxRentals bounds machines rented at once (not yet terminated),
	// over every connection; each connection may bound its own too.
	MaxRentals int
	// IdleTimeout retires a ready rental whose node had no Run this long.
	IdleTimeout time.Duration
	// LostAnswerAfter is how long a provision may go unanswered before the
	// provider's owned capacity is searched for it (and, failing that, it is
	// provisioned again under the same operation key).
	LostAnswerAfter time.Duration
	// EnrollTimeout is how long a rental may sit provisioning, booting or
	// enrolling (its node not enrolled) before it is given up and
	// terminated: a machine whose agent never comes (a bad image, a lost
	// disk) must not hold a Run, or a rental slot, forever.
	EnrollTimeout time.Duration
	// JanitorInterval is how often owned capacity is listed to adopt what a
	// rental lost track of and terminate what belongs to no live rental.
	JanitorInterval time.Duration
	// MaxLifetime is passed to providers that can enforce it.
	MaxLifetime time.Duration
	// Interval is how often rentals are observed.
	Interval time.Duration
	// LeaderTTL is the rental loop's leader lease: with several replicas
	// one runs the loop, and another takes over this long after it stops
	// renewing (at once when it stops cleanly).
	LeaderTTL time.Duration
	// ReadyEstimate is assumed for an offer whose provider states no
	// ReadySeconds: how long a new machine takes to run.
	ReadyEstimate time.Duration
	// RentMargin is how much sooner a fresh machine (ready, then pulling
	// the image) must start a Run than the soonest busy node that fits
	// before it is rented instead of queueing; the margin pays for the
	// estimates being estimates. Negative disables renting past a queue.
	RentMargin time.Duration
	// SpotPenalty is how long a spot pool (region and card) is left out
	// after one of its machines was interrupted; negative: never.
	SpotPenalty time.Duration
	// SpotInterruptionRate is the chance an interruptible machine is taken
	// back within an hour, assumed for an offer whose provider states none.
	SpotInterruptionRate float64
	// Budget, when set, is asked before each rental with its expected
	// cost: a tenant it does not allow gets no rental (nil: no budgets).
	Budget Budget
}

// Validate refuses a Config with no connection, or a connection without
// an id or a provider, or one id twice.
func (c Config) Validate() error {
	if len(c.Connections) == 0 && c.Provider == nil {
		return errors.New("no provider connection (Connections, or Provider)")
	}
	_, err := newConnections(c.Connections)
	return err
}

// Defaults fills the zero fields.
func (c *Config) Defaults() {
	if c.ConnectionID == "" {
		c.ConnectionID = defaultConnection
	}
	if len(c.Connections) == 0 && c.Provider != nil {
		c.Connections = []Connection{{ID: c.ConnectionID, Provider: c.Provider, OwnershipToken: c.OwnershipToken}}
	}
	c.Provider = nil // the shorthand is read once: every call goes through a connection
	if c.MaxRentals <= 0 {
		c.MaxRentals = 4
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.LostAnswerAfter <= 0 {
		c.LostAnswerAfter = 30 * time.Second
	}
	if c.JanitorInterval <= 0 {
		c.JanitorInterval = time.Minute
	}
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.EnrollTimeout <= 0 {
		c.EnrollTimeout = 20 * time.Minute
	}
	if c.LeaderTTL <= 0 {
		c.LeaderTTL = max(10*time.Second, 5*c.Interval)
	}
	if c.ReadyEstimate <= 0 {
		c.ReadyEstimate = 3 * time.Minute
	}
	if c.SpotPenalty == 0 {
		c.SpotPenalty = 30 * time.Minute
	}
	if c.SpotInterruptionRate <= 0 || c.SpotInterruptionRate >= 1 {
		c.SpotInterruptionRate = 0.05
	}
	if c.RentMargin == 0 {
		c.RentMargin = time.Minute
	}
}
