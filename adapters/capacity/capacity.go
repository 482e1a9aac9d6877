// Package capacity owns renting machines from providers: the contract every
// capacity adapter (fake, shadeform, local, …) implements, and the
// vocabulary the control plane uses to rent, observe, stop, resume,
// terminate and reconcile machines without knowing which provider it is
// talking to.
//
// The contract is shaped by what goes wrong with real providers: responses
// get lost after the provider acted, requests get delivered twice, stock runs
// out, spot capacity is reclaimed, and an old controller may act after a new
// one took over. So every provision carries an OperationKey and a RentalID
// chosen before the provider answers, every command carries the rental's
// Generation, every machine carries an OwnershipToken, and every provider
// declares (Support) what it can actually promise instead of pretending.
package capacity

import "context"

// Provider rents machines from one provider connection.
//
// Implementations are safe for concurrent use. Every method respects ctx.
// Errors carry one of the codes in errors.go where the outcome is known
// (matched with errors.Is); an error without a code means the outcome is
// unknown (a lost response, a timeout) and the caller must reconcile before
// it assumes nothing happened.
type Provider interface {
	// Support reports what this provider can actually do. Callers negotiate
	// against it instead of assuming stop, resume, spot or exact pricing.
	Support() Support
	// Verify is a cheap credential and reachability check. It allocates
	// nothing.
	Verify(ctx context.Context) error
	// ListCapacity lists the offers that satisfy query.
	ListCapacity(ctx context.Context, query OfferQuery) ([]Offer, error)
	// ProvisionCapacity allocates a fresh machine for one Rental. Repeating
	// it with the same OperationKey never allocates a second machine: the
	// provider deduplicates on the key (IdempotencyOperationKey) or the
	// adapter finds the first machine by listing what it owns
	// (IdempotencyNone), and either way answers Duplicate.
	ProvisionCapacity(ctx context.Context, cmd ProvisionCommand) (Receipt, error)
	// ObserveCapacity reports what the provider says about one machine now.
	ObserveCapacity(ctx context.Context, ref Ref) (Observation, error)
	// StartCapacity resumes a stopped machine. Providers without
	// Support.Resume return ErrUnsupported.
	StartCapacity(ctx context.Context, cmd Command) (Receipt, error)
	// StopCapacity suspends a machine, keeping its identity and, where
	// Support.PersistentDisk holds, its disk. Providers without
	// Support.Stop return ErrUnsupported.
	StopCapacity(ctx context.Context, cmd Command) (Receipt, error)
	// TerminateCapacity destroys a machine. It is idempotent: terminating
	// a machine that is already gone succeeds.
	TerminateCapacity(ctx context.Context, cmd Command) (Receipt, error)
	// ListOwnedCapacity enumerates the machines carrying the query's
	// ownership token, so reconciliation can adopt or terminate what the
	// control plane lost track of. It never returns a machine that merely
	// resembles ours. Providers without Support.ListOwned return
	// ErrUnsupported.
	ListOwnedCapacity(ctx context.Context, query OwnershipQuery) ([]OwnedCapacity, error)
}

// Declarer is implemented by every adapter: it states what the adapter is
// and which contracts it implements, so a connection can be registered
// without probing it.
type Declarer interface {
	Declaration() Declaration
}

// TypeOf is the adapter type v declares, "unknown" when it declares none.
func TypeOf(v any) string {
	if d, ok := v.(Declarer); ok {
		return d.Declaration().Type
	}
	return "unknown"
}

// Declaration is what an adapter says about itself. Each contract an
// adapter implements has a pointer field here that is present exactly when
// the adapter implements that contract; contracts other than capacity add
// their own field beside Capacity when they are written.
type Declaration struct {
	// Type is the adapter type ("fake", "shadeform", "local", …).
	Type string `json:"type"`
	// Lane is where the adapter's work runs: LaneNodes (machines that
	// enroll and take Runs) or LaneEphemeral (one-shot executions).
	Lane Lane `json:"lane"`
	// Capacity is present exactly when the adapter implements Provider, and
	// then equals its Support().
	Capacity *Support `json:"capacity,omitempty"`
	// Ephemeral is present exactly when the adapter implements
	// ephemeral.Executor, and then equals its Support().
	Ephemeral *EphemeralSupport `json:"ephemeral,omitempty"`
}

// Lane is where an adapter's work runs.
type Lane string

const (
	// LaneNodes: rented machines whose agents enroll and take Runs.
	LaneNodes Lane = "nodes"
	// LaneEphemeral: one execution per Run attempt on a provider's
	// product (a serverless queue, a standing pool); nothing is reused
	// between Runs.
	LaneEphemeral Lane = "ephemeral"
)
