package schemas

import "time"

// NodeState is the registry's view of a node.
type NodeState string

const (
	NodeReady    NodeState = "ready"
	NodeDraining NodeState = "draining"
	NodeLost     NodeState = "lost"
)

// NodeRecord is a node's entry in wf_nodes, changed only by CAS. The fencing
// token rises on every enrollment; the session token is stored as a hash.
type NodeRecord struct {
	NodeID           string    `json:"node_id"`
	RentalID         string    `json:"rental_id,omitempty"`
	Generation       uint64    `json:"generation"`
	FencingToken     uint64    `json:"fencing_token"`
	SessionTokenHash string    `json:"session_token_hash,omitempty"`
	SessionExpires   time.Time `json:"session_expires"`
	State            NodeState `json:"state"`
	EnrolledAt       time.Time `json:"enrolled_at"`
	LeaseExpires     time.Time `json:"lease_expires"`
	AgentVersion     string    `json:"agent_version,omitempty"`
	// Capacity is what the node offers to Runs; MaxWorkloads 0 means no cap.
	Capacity     Resources `json:"capacity"`
	MaxWorkloads int       `json:"max_workloads,omitempty"`
	// PricePerHour is what the node costs, for placement to weigh.
	PricePerHour float64    `json:"price_per_hour,omitempty"`
	Facts        *NodeFacts `json:"facts,omitempty"`
	// FactsReceivedAt is the control plane's clock when Facts arrived.
	FactsReceivedAt time.Time `json:"facts_received_at,omitzero"`
	// Interruptible marks a node on rented spot capacity (from its
	// rental): only Runs whose spot policy allows it are placed there.
	Interruptible bool `json:"interruptible,omitempty"`
	// Interruption is the node's own report that its provider is taking
	// it back; placement books nothing more there.
	Interruption *InterruptionNotice `json:"interruption,omitempty"`
}

// Live reports whether the node's lease holds at now.
func (n *NodeRecord) Live(now time.Time) bool {
	return n.State != NodeLost && now.Before(n.LeaseExpires)
}

// EnrollmentRequest is what an agent sends on wf.enroll.
type EnrollmentRequest struct {
	Version    int    `json:"version,omitempty"`
	NodeID     string `json:"node_id"`
	RentalID   string `json:"rental_id,omitempty"`
	Generation uint64 `json:"generation"`
	// EnrollmentToken is the single-use bootstrap secret; never logged.
	EnrollmentToken string    `json:"enrollment_token,omitempty"`
	AgentVersion    string    `json:"agent_version"`
	Capacity        Resources `json:"capacity"`
	MaxWorkloads    int       `json:"max_workloads,omitempty"`
	PricePerHour    float64   `json:"price_per_hour,omitempty"`
	Facts           NodeFacts `json:"facts"`
}

// Validate checks an EnrollmentRequest.
func (e *EnrollmentRequest) Validate() error {
	if e.Version < 0 || e.Version > SchemaVersion {
		return refuse(CodeUnsupportedVersion, "version", "version %d is not supported", e.Version)
	}
	if err := ValidateID("node_id", e.NodeID, CodeMalformed); err != nil {
		return err
	}
	if e.RentalID != "" {
		if err := ValidateID("rental_id", e.RentalID, CodeMalformed); err != nil {
			return err
		}
	}
	if e.PricePerHour < 0 || e.PricePerHour > 1e6 || e.PricePerHour != e.PricePerHour {
		return refuse(CodeMalformed, "price_per_hour", "must be a non-negative number of dollars per hour")
	}
	if e.MaxWorkloads < 0 {
		return refuse(CodeNegativeResource, "max_workloads", "must be zero (no cap) or positive")
	}
	if err := CheckNodeSizes("", e); err != nil {
		return err
	}
	return e.Capacity.validate("capacity")
}

// Enrollment is the control plane's answer to a successful enrollment.
type Enrollment struct {
	NodeID         string    `json:"node_id"`
	SessionToken   string    `json:"session_token"`
	SessionExpires time.Time `json:"session_expires"`
	FencingToken   uint64    `json:"fencing_token"`
	Generation     uint64    `json:"generation"`
	LeaseExpires   time.Time `json:"lease_expires"`
	// HeartbeatSeconds is how often the node must heartbeat.
	HeartbeatSeconds int64 `json:"heartbeat_seconds"`
	// Consumer is the durable command consumer on WF_CMDS bound to this node.
	Consumer  string `json:"consumer"`
	Duplicate bool   `json:"duplicate,omitempty"`
}

// NodeBootstrap is what a new machine receives (a file, user data) to
// enroll: where the control plane is, who the node is, and a single-use
// enrollment token. Only the token's hash is stored by the control plane.
type NodeBootstrap struct {
	ControlPlaneURL string    `json:"control_plane_url"`
	NodeID          string    `json:"node_id"`
	RentalID        string    `json:"rental_id,omitempty"`
	Generation      uint64    `json:"generation"`
	EnrollmentToken string    `json:"enrollment_token"`
	ExpiresAt       time.Time `json:"expires_at"`
	// AgentVersion is the agent build this node is expected to run.
	AgentVersion string `json:"agent_version,omitempty"`
	// ControlPlaneCA is the PEM of the CA the NATS server's certificate
	// chains to (public), so the agent dials TLS and trusts that server
	// with no other file.
	ControlPlaneCA string `json:"control_plane_ca,omitempty"`
}

// Invitation is the stored half of a NodeBootstrap in wf_enroll, keyed by
// the token's hash. Redeeming it deletes it at its revision, so a second
// redemption fails.
type Invitation struct {
	NodeID       string    `json:"node_id"`
	RentalID     string    `json:"rental_id,omitempty"`
	Generation   uint64    `json:"generation"`
	AgentVersion string    `json:"agent_version,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	ExpiresAt    time.Time `json:"expires_at"`
}

// InviteRequest asks the control plane (on wf.admin.node.invite) to mint a
// NodeBootstrap.
type InviteRequest struct {
	NodeID       string `json:"node_id"`
	RentalID     string `json:"rental_id,omitempty"`
	Generation   uint64 `json:"generation"`
	TTLSeconds   int64  `json:"ttl_seconds,omitempty"`
	AgentVersion string `json:"agent_version,omitempty"`
}

// Validate checks an InviteRequest.
func (r *InviteRequest) Validate() error {
	if err := ValidateID("node_id", r.NodeID, CodeMalformed); err != nil {
		return err
	}
	if r.RentalID != "" {
		if err := ValidateID("rental_id", r.RentalID, CodeMalformed); err != nil {
			return err
		}
	}
	if r.Generation == 0 {
		return refuse(CodeMissingField, "generation", "must be 1 or more; bump it each time the machine is reprovisioned")
	}
	if r.TTLSeconds < 0 || r.TTLSeconds > 7*24*3600 {
		return refuse(CodeMalformed, "ttl_seconds", "must be between 0 (default) and one week")
	}
	return nil
}

// SessionRenewal is both the request (SessionToken set) and the answer
// (SessionExpires set) on wf.node.<id>.renew. Renewal never moves the
// fencing token.
type SessionRenewal struct {
	NodeID         string    `json:"node_id"`
	SessionToken   string    `json:"session_token,omitempty"`
	SessionExpires time.Time `json:"session_expires,omitzero"`
	FencingToken   uint64    `json:"fencing_token"`
}

// Validate checks a renewal request: the node's id and its bounded token.
func (r *SessionRenewal) Validate() error {
	if err := ValidateID("node_id", r.NodeID, CodeMalformed); err != nil {
		return err
	}
	return CheckNodeSizes("", r)
}

// Heartbeat is a node's cheap liveness report on wf.node.<id>.heartbeat.
type Heartbeat struct {
	NodeID       string    `json:"node_id"`
	FencingToken uint64    `json:"fencing_token"`
	SentAt       time.Time `json:"sent_at"`
	Running      int       `json:"running"`
	// Interruption is set once the machine has been told its provider is
	// taking it back (the agent's --interruption-notice-* watch).
	Interruption *InterruptionNotice `json:"interruption,omitempty"`
}

// Validate checks a heartbeat's node id and counts.
func (h *Heartbeat) Validate() error {
	if err := ValidateID("node_id", h.NodeID, CodeMalformed); err != nil {
		return err
	}
	if h.Running < 0 {
		return refuse(CodeNegativeResource, "running", "a count of workloads is not negative")
	}
	if h.Interruption != nil {
		return h.Interruption.Validate()
	}
	return nil
}

// Reply wraps request/reply answers: either OK's payload or a Refusal.
type Reply[T any] struct {
	OK      *T       `json:"ok,omitempty"`
	Refusal *Refusal `json:"refusal,omitempty"`
}

// NodeLease is a node's live lease as a control-plane replica holds it: the
// later of the registry's lease and the one its current session's
// heartbeats earned.
type NodeLease struct {
	NodeID       string    `json:"node_id"`
	FencingToken uint64    `json:"fencing_token"`
	State        NodeState `json:"state"`
	LeaseExpires time.Time `json:"lease_expires"`
}

// AdminRequest names the object of an operator's request on wf.admin.*.
type AdminRequest struct {
	ID     string `json:"id"`
	Reason string `json:"reason,omitempty"`
}
