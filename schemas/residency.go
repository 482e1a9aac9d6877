package schemas

import "time"

// The residency protocol: a session host's requests to the control plane's
// residency stores on wf.node.<id>.residency.<op> and their replies, all
// JSON, and the records those stores keep in wf_leases, wf_residency and
// wf_sessions, which operators read with `nats kv get`. Package residency
// owns what the values mean (its Key, the lease and fencing rules); these
// are the shapes that travel and are stored.

// ResidencyOp names an operation the control plane's residency stores
// serve on wf.node.<id>.residency.<op>.
type ResidencyOp string

// Residency store operations.
const (
	// ResidencyLeaseAcquire takes a ResidencyKeyRequest and answers a
	// SessionLeaseGrant to the node in the subject.
	ResidencyLeaseAcquire ResidencyOp = "lease_acquire"
	// ResidencyLeaseRenew and ResidencyLeaseRelease take the
	// SessionLeaseGrant last answered; renew answers the next one.
	ResidencyLeaseRenew   ResidencyOp = "lease_renew"
	ResidencyLeaseRelease ResidencyOp = "lease_release"
	// ResidencyRoutePublish takes a ResidencyObservation.
	ResidencyRoutePublish ResidencyOp = "route_publish"
	// ResidencyRouteTombstone takes a ResidencyTombstoneRequest.
	ResidencyRouteTombstone ResidencyOp = "route_tombstone"
	// ResidencyStateLoad takes a ResidencyKeyRequest and answers a
	// SessionState.
	ResidencyStateLoad ResidencyOp = "state_load"
	// ResidencyStateCheckpoint takes a SessionCheckpoint.
	ResidencyStateCheckpoint ResidencyOp = "state_checkpoint"
)

// ResidencyKeyRequest names the session of a lease acquire or a state load.
type ResidencyKeyRequest struct {
	Key SessionKey `json:"key"`
	// Token makes a lease acquire idempotent: a live grant to the same
	// node under the same token is answered again, not refused as held.
	Token string `json:"token,omitempty"`
}

// ResidencyTombstoneRequest asks for the `expired` tombstone of a session's
// route at Epoch, hosted by the node in the subject.
type ResidencyTombstoneRequest struct {
	Key   SessionKey     `json:"key"`
	Epoch ResidencyEpoch `json:"epoch"`
}

// ResidencyReply answers a residency request: its result (an empty object
// for an operation that has none), or the error as the session protocol
// carries it.
type ResidencyReply[R any] struct {
	OK    *R            `json:"ok,omitempty"`
	Error *SessionError `json:"error,omitempty"`
}

// SessionLeaseGrant is one grant of a session lease, as a host holds it.
type SessionLeaseGrant struct {
	Key    SessionKey     `json:"key"`
	Holder string         `json:"holder"`
	Epoch  ResidencyEpoch `json:"epoch"`
	// Revision is the wf_leases revision this grant was last written at:
	// renew and release are CAS writes at this revision (or, after a
	// write of this grant whose answer was lost, at the one that holds it).
	Revision uint64 `json:"revision"`
	// TTL is the lease's lifetime from each renewal, in nanoseconds.
	TTL time.Duration `json:"ttl"`
	// GrantedAt is when the control plane granted this epoch.
	GrantedAt time.Time `json:"granted_at"`
	// ExpiresAt is the record's expiry as the control plane wrote it.
	ExpiresAt time.Time `json:"expires_at"`
	// Token identifies this grant across an ambiguous write.
	Token string `json:"token"`
}

// SessionLeaseRecord is a session lease as stored in wf_leases under
// `<tenant>.<session>`.
type SessionLeaseRecord struct {
	Tenant    string         `json:"tenant"`
	Session   string         `json:"session"`
	Holder    string         `json:"holder"`
	Epoch     ResidencyEpoch `json:"epoch"`
	ExpiresAt time.Time      `json:"expires_at"`
	GrantedAt time.Time      `json:"granted_at"`
	RenewedAt time.Time      `json:"renewed_at,omitzero"`
	Released  bool           `json:"released,omitempty"`
	Token     string         `json:"token"`
}

// Live reports whether the lease is held at now. Liveness is the record's
// own expires_at, never a KV TTL (a per-key TTL is dropped by Update).
func (r SessionLeaseRecord) Live(now time.Time) bool { return now.Before(r.ExpiresAt) }

// LeaseEpoch and LeaseExpiresAt make a SessionLeaseRecord a bus.LeaseRecord.
func (r SessionLeaseRecord) LeaseEpoch() uint64        { return uint64(r.Epoch) }
func (r SessionLeaseRecord) LeaseExpiresAt() time.Time { return r.ExpiresAt }

// SessionPlacement is the node an operator's attach placed a session on,
// stored in wf_leases under `placements/<tenant>.<session>` while the
// attach runs: only that node may acquire the session's lease, and only
// until ExpiresAt (the attach's own deadline). Like a lease, its liveness
// is its own expires_at; the next attach overwrites it.
type SessionPlacement struct {
	Tenant    string    `json:"tenant"`
	Session   string    `json:"session"`
	Node      string    `json:"node"`
	ExpiresAt time.Time `json:"expires_at"`
}

// ResidencyState is a residency's state as published in wf_residency
// (residency.StateResident and the others; `expired` is the tombstone).
type ResidencyState string

// ResidencyObservation is a residency as published in wf_residency under
// `<tenant>.<session>`, and the body of a route publish.
type ResidencyObservation struct {
	Tenant  string         `json:"tenant"`
	Session string         `json:"session"`
	Host    string         `json:"host"`
	Epoch   ResidencyEpoch `json:"lease_epoch"`
	// Generation is the host-local registry generation of the residency.
	Generation uint64         `json:"generation"`
	State      ResidencyState `json:"state"`
	// Accepting is false while the host drains and in every state but
	// resident: a router must not send new sessions' work here.
	Accepting       bool   `json:"accepting"`
	Workload        string `json:"workload,omitempty"`
	CompatibilityID string `json:"compatibility_id,omitempty"`
	Namespace       string `json:"namespace,omitempty"`
	// CPUMillis, MemoryBytes and GPUs (card UUIDs) are what the residency's
	// workload holds on its host: the control plane books them in the same
	// ledger as Runs.
	CPUMillis   int64     `json:"cpu_millis,omitempty"`
	MemoryBytes int64     `json:"memory_bytes,omitempty"`
	GPUs        []string  `json:"gpus,omitempty"`
	ObservedAt  time.Time `json:"observed_at"`
}

// SessionRecord is a session's durable state as stored in wf_sessions under
// `<tenant>.<session>`. It outlives every residency; only the control plane
// writes it.
type SessionRecord struct {
	Tenant    string `json:"tenant"`
	Session   string `json:"session"`
	Namespace string `json:"namespace"`
	// CompatibilityID is the runtime build that wrote the state.
	CompatibilityID string `json:"compatibility_id"`
	// CheckpointSequence is the latest committed checkpoint; 0 means the
	// session was created and has not checkpointed yet.
	CheckpointSequence uint64 `json:"checkpoint_sequence"`
	// Epoch is the lease epoch of the last write: a write under a lower one
	// is refused, so a stale holder cannot overwrite its successor's
	// checkpoint.
	Epoch     ResidencyEpoch `json:"lease_epoch"`
	Host      string         `json:"host"`
	UpdatedAt time.Time      `json:"updated_at"`
	// Checkpoint is what the latest checkpoint holds of the workspace, in
	// wf_checkpoints as (CheckpointSequence, Epoch); nil when it saved no
	// workspace (a record from before workspaces were checkpointed).
	Checkpoint *CheckpointSummary `json:"checkpoint,omitempty"`
	// Recent are the latest checkpoints that saved the workspace, oldest
	// first, as many as the control plane keeps: their content stays in
	// wf_checkpoints, an older one's is deleted.
	Recent []CheckpointRef `json:"recent_checkpoints,omitempty"`
}

// CheckpointRef names a checkpoint: its sequence and the lease epoch it
// was taken under.
type CheckpointRef struct {
	Sequence uint64         `json:"sequence"`
	Epoch    ResidencyEpoch `json:"epoch"`
}

// CheckpointSummary is a checkpoint of a session's workspace, as the
// session's record and events show it.
type CheckpointSummary struct {
	TakenAt time.Time `json:"taken_at"`
	// Files and Bytes are the workspace's; BytesMoved what this checkpoint
	// sent (the chunks the store lacked); Seconds how long it took.
	Files      int     `json:"files"`
	Bytes      int64   `json:"bytes"`
	BytesMoved int64   `json:"bytes_moved"`
	Seconds    float64 `json:"seconds"`
}

// SessionCheckpoint is what a release commits before it lets the runtime
// go: the body of a state checkpoint. Its field names are its Go names, as
// agents have always sent them.
type SessionCheckpoint struct {
	Key             SessionKey     `json:"Key"`
	Host            string         `json:"Host"`
	Epoch           ResidencyEpoch `json:"Epoch"`
	Sequence        uint64         `json:"Sequence"`
	CompatibilityID string         `json:"CompatibilityID"`
	Namespace       string         `json:"Namespace"`
	// Content is the workspace checkpoint this commit records, taken at
	// (Sequence, Epoch); nil when the host saved none.
	Content *CheckpointSummary `json:"Content,omitempty"`
}

// RuntimeJournal is what the durable store knows of the runtime's own
// journal for a session, as a number on the wire. The zero value is
// unknown, which refuses a create: a store that forgot to answer fails
// closed.
type RuntimeJournal int

// Runtime journal states.
const (
	JournalUnknown RuntimeJournal = iota
	JournalEmpty
	JournalPresent
)

func (j RuntimeJournal) String() string {
	switch j {
	case JournalEmpty:
		return "empty"
	case JournalPresent:
		return "present"
	default:
		return "unknown"
	}
}

// SessionState is a session's durable state, which outlives any residency:
// the answer to a state load. Its field names are its Go names, as agents
// have always read them.
type SessionState struct {
	// Exists reports whether the session has durable state at all.
	Exists bool `json:"Exists"`
	// Namespace is the object prefix the runtime writes under. It is
	// required whether or not the session exists; an empty one is refused.
	Namespace string `json:"Namespace"`
	// CompatibilityID is the runtime build that wrote the state. A restore
	// onto another build is refused.
	CompatibilityID string `json:"CompatibilityID"`
	// RuntimeJournal decides a create: only JournalEmpty may be created.
	RuntimeJournal RuntimeJournal `json:"RuntimeJournal"`
	// HasCheckpoint and CheckpointSequence are the latest checkpoint.
	HasCheckpoint      bool   `json:"HasCheckpoint"`
	CheckpointSequence uint64 `json:"CheckpointSequence"`
	// CheckpointEpoch is the epoch the latest checkpoint was taken under,
	// and Checkpoint what it holds of the workspace (nil: none saved).
	CheckpointEpoch ResidencyEpoch     `json:"CheckpointEpoch,omitempty"`
	Checkpoint      *CheckpointSummary `json:"Checkpoint,omitempty"`
	// EarlierCheckpoints are the kept workspace checkpoints before the
	// latest, newest first: what an attach may restore instead of it.
	EarlierCheckpoints []CheckpointRef `json:"EarlierCheckpoints,omitempty"`
}

// Validate bounds a lease acquire's or state load's body (CheckNodeSizes);
// package residency checks what the key means.
func (r *ResidencyKeyRequest) Validate() error { return CheckNodeSizes("", r) }

// Validate bounds a route tombstone's body.
func (r *ResidencyTombstoneRequest) Validate() error { return CheckNodeSizes("", r) }

// Validate bounds a lease renew's or release's body.
func (g *SessionLeaseGrant) Validate() error { return CheckNodeSizes("", g) }

// Validate bounds a route publish's body.
func (o *ResidencyObservation) Validate() error { return CheckNodeSizes("", o) }

// Validate bounds a state checkpoint's body.
func (c *SessionCheckpoint) Validate() error { return CheckNodeSizes("", c) }
