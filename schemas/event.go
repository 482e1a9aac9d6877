package schemas

import "time"

// EventType classifies a RunEvent.
type EventType string

const (
	EventAccepted EventType = "accepted"
	EventRejected EventType = "rejected"
	EventDecided  EventType = "decided"
	EventPhase    EventType = "phase"
	EventCancel   EventType = "cancel_requested"
	EventNote     EventType = "note" // an observation worth recording that moves no phase
)

// RunEvent is one entry of a Run's audit log on wf.events.run.<run_id>.
type RunEvent struct {
	RunID     string    `json:"run_id"`
	Seq       uint64    `json:"seq"`
	Type      EventType `json:"type"`
	RequestID string    `json:"request_id,omitempty"`
	From      Phase     `json:"from,omitempty"`
	Phase     Phase     `json:"phase,omitempty"`
	NodeID    string    `json:"node_id,omitempty"`
	Attempt   int       `json:"attempt,omitempty"`
	Code      Code      `json:"code,omitempty"`
	Field     string    `json:"field,omitempty"`
	Message   string    `json:"message,omitempty"`
	ExitCode  *int      `json:"exit_code,omitempty"`
	OOMKilled bool      `json:"oom_killed,omitempty"`
	// At is the control plane's clock when it recorded the event.
	At time.Time `json:"at"`
	// ObservedAt is the node's clock for events caused by a node's report.
	ObservedAt *time.Time       `json:"observed_at,omitempty"`
	Decision   *BookingDecision `json:"decision,omitempty"`
}

// BookingDecision records a placement: the winner and why every other
// candidate lost (invariant 4).
type BookingDecision struct {
	RunID      string      `json:"run_id"`
	Attempt    int         `json:"attempt"`
	Winner     string      `json:"winner,omitempty"`
	Candidates []Candidate `json:"candidates"`
	DecidedAt  time.Time   `json:"decided_at"`
}

// Candidate is one node considered for a booking.
type Candidate struct {
	NodeID   string  `json:"node_id"`
	Eligible bool    `json:"eligible"`
	Reason   Code    `json:"reason,omitempty"` // why an ineligible or losing node lost
	Detail   string  `json:"detail,omitempty"`
	Score    float64 `json:"score,omitempty"`
	// Free is what the node had unreserved when the decision was made.
	Free Resources `json:"free"`
}

// Placement reason codes.
const (
	ReasonInsufficientCPU    Code = "insufficient_cpu"
	ReasonInsufficientMemory Code = "insufficient_memory"
	ReasonInsufficientGPU    Code = "insufficient_gpu"
	ReasonLeaseStale         Code = "lease_stale"
	ReasonNodeNotReady       Code = "node_not_ready"
	ReasonAtCapacity         Code = "at_max_workloads"
	ReasonOutscored          Code = "outscored"
)
