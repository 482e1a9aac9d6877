package capacity

import "time"

// Observation is what the provider says about one machine at ObservedAt.
type Observation struct {
	NativeRef  string    `json:"native_ref"`
	State      State     `json:"state"`
	ObservedAt time.Time `json:"observed_at"`
	// StateSince is the provider's own record of when the machine entered
	// State, and the zero time when the provider does not date its
	// transitions. It is never filled with ObservedAt or the time of a
	// previous poll: that would publish our polling cadence as a property of
	// the machine.
	StateSince time.Time `json:"state_since,omitzero"`
	// Endpoint is where the machine can be reached, when the provider says.
	// It is provenance for operators, never a control channel: nodes are
	// reached only through their own outbound agent session.
	Endpoint string `json:"endpoint,omitempty"`
	// Interrupted reports provider-initiated reclamation of interruptible
	// capacity, a different fact from a machine someone stopped.
	Interrupted bool `json:"interrupted,omitempty"`
	// NativeJSON is the provider's record of the machine, with anything
	// secret (startup scripts, environment) removed.
	NativeJSON string `json:"native_json,omitempty"`
}

// OwnershipQuery selects the machines ListOwnedCapacity returns.
type OwnershipQuery struct {
	ConnectionID string `json:"connection_id,omitempty"`
	// OwnershipToken is required: only machines carrying it are ours.
	OwnershipToken string `json:"ownership_token"`
	// RentalID narrows the answer to one rental when set.
	RentalID string `json:"rental_id,omitempty"`
}

// Validate requires the ownership token.
func (q OwnershipQuery) Validate() error {
	if err := checkID("ownership_token", q.OwnershipToken); err != nil {
		return err
	}
	if q.RentalID != "" {
		return checkID("rental_id", q.RentalID)
	}
	return nil
}

// OwnedCapacity is one machine carrying our ownership token.
type OwnedCapacity struct {
	NativeRef      string `json:"native_ref"`
	ConnectionID   string `json:"connection_id,omitempty"`
	RentalID       string `json:"rental_id,omitempty"`
	Generation     uint64 `json:"generation,omitempty"`
	OwnershipToken string `json:"ownership_token"`
	// OperationKey is the provision that created the machine, when the
	// provider kept it; it is how a lost response is matched to its machine.
	OperationKey string    `json:"operation_key,omitempty"`
	State        State     `json:"state"`
	CreatedAt    time.Time `json:"created_at,omitzero"`
}
