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
	// EventProgress records how far an image transfer has come; it moves
	// no phase and is sent at most once per the node's progress interval.
	EventProgress EventType = "progress"
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
	ObservedAt *time.Time        `json:"observed_at,omitempty"`
	Decision   *BookingDecision  `json:"decision,omitempty"`
	Progress   *TransferProgress `json:"progress,omitempty"`
}

// BookingDecision records a placement: the winner and why every other
// candidate lost (invariant 4).
type BookingDecision struct {
	RunID   string `json:"run_id"`
	Attempt int    `json:"attempt"`
	Winner  string `json:"winner,omitempty"`
	// WinnerQueued means the winner is busy and the Run waits in its queue
	// (it prefetches its image meanwhile).
	WinnerQueued bool        `json:"winner_queued,omitempty"`
	Candidates   []Candidate `json:"candidates"`
	DecidedAt    time.Time   `json:"decided_at"`
}

// Candidate is one node considered for a booking.
type Candidate struct {
	NodeID   string `json:"node_id"`
	Eligible bool   `json:"eligible"`
	Reason   Code   `json:"reason,omitempty"` // why an ineligible or losing node lost
	Detail   string `json:"detail,omitempty"`
	// Cost is the score, lower wins: seconds until the Run could start plus
	// price converted to seconds.
	Cost       float64         `json:"cost,omitempty"`
	Components ScoreComponents `json:"components,omitzero"`
	// Free is what the node had unreserved when the decision was made.
	Free Resources `json:"free"`
}

// ScoreComponents explain a Cost.
type ScoreComponents struct {
	ImageState     string  `json:"image_state,omitempty"`
	PullBytes      int64   `json:"pull_bytes,omitempty"`
	PullSeconds    float64 `json:"pull_seconds,omitempty"`
	CachesWarm     int     `json:"caches_warm,omitempty"`
	CacheFillBytes int64   `json:"cache_fill_bytes,omitempty"`
	CacheSeconds   float64 `json:"cache_seconds,omitempty"`
	QueueSeconds   float64 `json:"queue_seconds,omitempty"`
	StartSeconds   float64 `json:"start_seconds"`
	PricePerHour   float64 `json:"price_per_hour,omitempty"`
}

// Placement reason codes.
const (
	ReasonInsufficientCPU    Code = "insufficient_cpu"
	ReasonInsufficientMemory Code = "insufficient_memory"
	ReasonInsufficientGPU    Code = "insufficient_gpu"
	ReasonInsufficientDisk   Code = "insufficient_disk"
	ReasonDiskUnknown        Code = "disk_unknown"
	ReasonGPUModelMismatch   Code = "gpu_model_mismatch"
	ReasonDriverMissing      Code = "driver_missing"
	ReasonDriverTooOld       Code = "driver_too_old"
	ReasonPlatformMismatch   Code = "platform_mismatch"
	ReasonLeaseStale         Code = "lease_stale"
	ReasonFactsStale         Code = "facts_stale"
	ReasonNodeNotReady       Code = "node_not_ready"
	ReasonNodeDraining       Code = "node_draining"
	ReasonAtCapacity         Code = "at_max_workloads"
	ReasonQueueFull          Code = "queue_full"
	ReasonOutscored          Code = "outscored"
)
