package schemas

import (
	"fmt"
	"time"
)

// The session protocol: an operator's requests on wf.admin.session.*, the
// control plane's commands to a node's session host on
// wf.node.<id>.sessions.<op>, and their replies, all JSON. Package
// residency owns what the values mean (its Key, Mode, Code and lifecycle
// Phase); these are the shapes that travel.

// SessionKey names one session on the wire: tenant id + session id.
type SessionKey struct {
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
}

// SessionMode says whether an attach creates a session or resumes one
// (residency.ModeCreate, residency.ModeResume).
type SessionMode string

// SessionCode classifies a session error on the wire; package residency
// lists the codes and the sentinel error each stands for.
type SessionCode string

// ResidencyEpoch is a session's lease epoch: 1 for the first grant, +1 for
// every grant after an expiry. It fences every residency write.
type ResidencyEpoch uint64

// ResidencyPhase is where one residency is in its lifecycle on its host
// (residency.Phase).
type ResidencyPhase string

// SessionError is an error as it travels in a session reply: a code a
// caller branches on, and text for an operator.
type SessionError struct {
	Code    SessionCode `json:"code"`
	Message string      `json:"message"`
	// Field names the request's field at fault, when one is (a tenant
	// refused invalid_tenant or tenant_unknown).
	Field string `json:"field,omitempty"`
	// Step and Unreleased are set for a failed attach: the step that
	// failed and what its compensation could not release.
	Step       string   `json:"step,omitempty"`
	Unreleased []string `json:"unreleased,omitempty"`
	// Unwritten is set for a failed release: what it could not write.
	Unwritten []string `json:"unwritten,omitempty"`
	// PreviousCheckpoint is set when a restore failed and an earlier kept
	// checkpoint may be restored instead (from_checkpoint).
	PreviousCheckpoint uint64 `json:"previous_checkpoint,omitempty"`
}

func (e *SessionError) Error() string {
	s := string(e.Code) + ": " + e.Message
	if len(e.Unreleased) > 0 {
		s += fmt.Sprintf(" (still held: %v)", e.Unreleased)
	}
	if len(e.Unwritten) > 0 {
		s += fmt.Sprintf(" (not written: %v)", e.Unwritten)
	}
	return s
}

// SessionOp names an operation a session host serves on
// wf.node.<id>.sessions.<op>.
type SessionOp string

// Session host operations.
const (
	SessionAttach  SessionOp = "attach"
	SessionRelease SessionOp = "release"
	SessionList    SessionOp = "list"
	SessionDrain   SessionOp = "drain"
)

// SessionCommand is the control plane's request to a node's session host.
type SessionCommand struct {
	// FencingToken is the node session the control plane addresses; a host
	// whose enrollment holds another refuses (residency.CodeStaleNode).
	FencingToken    uint64      `json:"fencing_token"`
	Tenant          string      `json:"tenant,omitempty"`
	Session         string      `json:"session,omitempty"`
	Mode            SessionMode `json:"mode,omitempty"`
	CompatibilityID string      `json:"compatibility_id,omitempty"`
	Actor           string      `json:"actor,omitempty"`
	Trace           string      `json:"trace,omitempty"`
	// GPUs are the cards booked to the session on this host, by UUID, and
	// Devices their CDI devices, in the same order.
	GPUs    []string `json:"gpus,omitempty"`
	Devices []string `json:"devices,omitempty"`
	// FromCheckpoint is the request's (SessionRequest.FromCheckpoint).
	FromCheckpoint uint64 `json:"from_checkpoint,omitempty"`
}

// Key is the command's session.
func (c SessionCommand) Key() SessionKey { return SessionKey{Tenant: c.Tenant, Session: c.Session} }

// ResidencyView is a residency as reported over the wire.
type ResidencyView struct {
	Tenant          string         `json:"tenant"`
	Session         string         `json:"session"`
	Host            string         `json:"host"`
	Epoch           ResidencyEpoch `json:"lease_epoch"`
	Generation      uint64         `json:"generation"`
	Phase           ResidencyPhase `json:"phase"`
	Workload        string         `json:"workload,omitempty"`
	Namespace       string         `json:"namespace,omitempty"`
	CompatibilityID string         `json:"compatibility_id,omitempty"`
	Attached        bool           `json:"attached"`
	// Restored is the workspace checkpoint this attach restored; nil when
	// it restored none (a create, an empty workspace, or Attached false).
	Restored *RestoredCheckpoint `json:"restored,omitempty"`
}

// RestoredCheckpoint names the checkpoint an attach restored, and when it
// was taken (zero for an earlier kept one, whose time the record does not
// keep).
type RestoredCheckpoint struct {
	Sequence uint64         `json:"sequence"`
	Epoch    ResidencyEpoch `json:"epoch"`
	TakenAt  time.Time      `json:"taken_at,omitzero"`
}

// SessionEventType is what a session event records.
type SessionEventType string

// Session event types.
const (
	// SessionAttached: the session became resident on Node at Epoch, from
	// the checkpoint Restored names (none: an empty workspace).
	SessionAttached SessionEventType = "session.attached"
	// SessionCheckpointed: Node committed checkpoint Sequence at Epoch.
	SessionCheckpointed SessionEventType = "session.checkpointed"
)

// SessionEvent is one event of a session, on WF_EVENTS
// (bus.SessionEventsSubject), published by the control plane.
type SessionEvent struct {
	Type    SessionEventType `json:"type"`
	Tenant  string           `json:"tenant"`
	Session string           `json:"session"`
	Node    string           `json:"node"`
	Epoch   ResidencyEpoch   `json:"lease_epoch"`
	At      time.Time        `json:"at"`
	// Restored is set on session.attached.
	Restored *RestoredCheckpoint `json:"restored,omitempty"`
	// Sequence and Checkpoint are set on session.checkpointed: what the
	// committed checkpoint holds of the workspace (nil: none saved).
	Sequence   uint64             `json:"sequence,omitempty"`
	Checkpoint *CheckpointSummary `json:"checkpoint,omitempty"`
}

// DrainView is a node's session drain as reported over the wire.
type DrainView struct {
	Node     string         `json:"node"`
	Released []SessionKey   `json:"released"`
	Gone     []SessionKey   `json:"gone,omitempty"`
	Failures []DrainFailure `json:"failures,omitempty"`
	// Error is set when the drain could not run at all (the node did not
	// answer, or answered with a refusal).
	Error *SessionError `json:"error,omitempty"`
}

// DrainFailure is one session a drain could not release cleanly.
type DrainFailure struct {
	Key       SessionKey `json:"key"`
	Unwritten []string   `json:"unwritten,omitempty"`
	Reason    string     `json:"reason"`
}

// SessionReply is a session host's answer to a SessionCommand, and the
// control plane's to an operator's SessionRequest.
type SessionReply struct {
	Residency   *ResidencyView  `json:"residency,omitempty"`
	Residencies []ResidencyView `json:"residencies,omitempty"`
	Drain       *DrainView      `json:"drain,omitempty"`
	Error       *SessionError   `json:"error,omitempty"`
}

// SessionRequest is an operator's request on wf.admin.session.*.
type SessionRequest struct {
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
	// Mode is create or resume (attach only); resume when empty and the
	// session has durable state, create otherwise.
	Mode SessionMode `json:"mode,omitempty"`
	// Node pins the attach to one node; any ready node that fits when empty.
	Node            string `json:"node,omitempty"`
	CompatibilityID string `json:"compatibility_id,omitempty"`
	Actor           string `json:"actor,omitempty"`
	// GPUCount is how many cards the session holds while resident (attach
	// only); the control plane books them on the node it chooses.
	GPUCount int64 `json:"gpu_count,omitempty"`
	// FromCheckpoint restores the kept workspace checkpoint of this
	// sequence instead of the latest (attach only; 0: the latest).
	FromCheckpoint uint64 `json:"from_checkpoint,omitempty"`
}

// Key is the request's session.
func (r SessionRequest) Key() SessionKey { return SessionKey{Tenant: r.Tenant, Session: r.Session} }

// NodeDrainReply answers wf.admin.node.drain: the node record, as the
// Reply[NodeRecord] every caller decodes, and the sessions the drain
// released and could not release.
type NodeDrainReply struct {
	OK      *NodeRecord `json:"ok,omitempty"`
	Refusal *Refusal    `json:"refusal,omitempty"`
	// Sessions is the node's session drain; nil when the control plane
	// serves no sessions.
	Sessions *DrainView `json:"sessions,omitempty"`
}

// Validate bounds a session host's reply (CheckNodeSizes).
func (r *SessionReply) Validate() error { return CheckNodeSizes("", r) }

// Validate bounds a session command as its host receives it
// (CheckNodeSizes); the host checks what its key means.
func (c *SessionCommand) Validate() error { return CheckNodeSizes("", c) }
