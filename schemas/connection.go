package schemas

import "time"

// ConnectionStatus is how one capacity provider or ephemeral executor
// connection stands, as the control plane replica answering sees it
// (wf.admin.rental.connections).
type ConnectionStatus struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	// State is ConnectionOK, or ConnectionFailed when its last Verify
	// failed: it is skipped (no offers listed, nothing rented) until a
	// later Verify succeeds; its rentals are still observed.
	State      string    `json:"state"`
	Error      string    `json:"error,omitempty"`
	VerifiedAt time.Time `json:"verified_at,omitzero"`
	// Live is how many of its rentals hold a machine; MaxRentals its own
	// limit (0: only the overall one).
	Live       int `json:"live"`
	MaxRentals int `json:"max_rentals,omitempty"`
	// Lane marks an ephemeral executor's connection: Live counts the Runs
	// whose executions it holds, and it rents no machines.
	Lane bool `json:"lane,omitempty"`
}

// Connection states.
const (
	ConnectionOK      = "ok"
	ConnectionFailed  = "failed"
	ConnectionPending = "unverified"
)
