package schemas

import (
	"strconv"
	"time"
)

// Phase is where a Run is in its lifecycle. The legal moves between phases
// are the control plane's transition table (controlplane/lifecycle/table.go).
type Phase string

const (
	PhaseAccepted  Phase = "accepted"  // stored, waiting for a node
	PhasePlaced    Phase = "placed"    // booked on a node, commands sent
	PhasePreparing Phase = "preparing" // node is fetching/unpacking the image
	PhaseLaunching Phase = "launching" // image ready, container being started
	PhaseRunning   Phase = "running"
	PhaseSucceeded Phase = "succeeded"
	PhaseFailed    Phase = "failed"
	PhaseCancelled Phase = "cancelled"
	PhaseLost      Phase = "lost" // the node stopped answering; terminal for this attempt
)

// Terminal reports whether no further transition is possible.
func (p Phase) Terminal() bool {
	switch p {
	case PhaseSucceeded, PhaseFailed, PhaseCancelled, PhaseLost:
		return true
	}
	return false
}

// Run is the control plane's record of one accepted RunRequest, stored in
// wf_runs under its id. Every change is a CAS update.
type Run struct {
	ID string `json:"id"`
	// Tenant owns the Run: its producers alone submit, cancel and read it.
	// Empty in a record stored before tenants is DefaultTenant (TenantOf).
	Tenant string `json:"tenant,omitempty"`
	// SubmittedBy is the identity that submitted it: a producer's name, or
	// "operator".
	SubmittedBy string     `json:"submitted_by,omitempty"`
	Request     RunRequest `json:"request"`
	Phase       Phase      `json:"phase"`
	Attempt     int        `json:"attempt"`
	NodeID      string     `json:"node_id,omitempty"`
	AttemptID   string     `json:"attempt_id,omitempty"`
	// FencingToken is the node's token when this attempt was booked; commands
	// for the attempt carry it.
	FencingToken uint64 `json:"fencing_token,omitempty"`
	Generation   uint64 `json:"generation,omitempty"`
	// GPUs are the UUIDs of the cards the current attempt holds on its
	// node; a card belongs to one attempt at a time. A queued attempt holds
	// none until it leaves the queue.
	GPUs []string `json:"gpus,omitempty"`
	// Artifacts are the request's artifacts as the catalog resolved them
	// at intake, in the request's order: a Run's content never changes
	// after it is accepted.
	Artifacts []ArtifactMount `json:"artifacts,omitempty"`

	// Queued means the Run is booked on NodeID but waits in its queue: for
	// room, or for its bytes (AwaitsBytes); only its image and artifacts
	// are prepared until then.
	Queued bool `json:"queued,omitempty"`
	// AwaitsBytes means the queued attempt claims its cards only once its
	// node reports its image and artifacts prepared (the node prepares
	// ahead: NodeSupport.Prewarm): no card sits idle while they arrive.
	AwaitsBytes bool `json:"awaits_bytes,omitempty"`
	// ReadyBy is when the attempt's bytes should all be on its node, as
	// its decision estimated (nil: it fetches nothing): until then the
	// node's link is taken, and placement prices a later fetch there
	// after it.
	ReadyBy *time.Time `json:"ready_by,omitempty"`
	// Waiting summarises why an accepted Run has no node, so an unchanged
	// answer is not recorded again on every scheduling pass.
	Waiting string `json:"waiting,omitempty"`
	// WaitCode is why an accepted Run waits (no_capacity, quota, budget,
	// preempting, retry_backoff, rent_beats_queue); empty once booked.
	WaitCode Code `json:"wait_code,omitempty"`

	// Retry is the Run's effective retry policy, resolved at intake (the
	// request's, else its tenant's default); nil retries node loss alone,
	// up to the control plane's MaxAttempts.
	Retry *RetryPolicy `json:"retry,omitempty"`
	// Execution is the current attempt's execution on the ephemeral lane
	// (lane.go); nil on a node.
	Execution *Execution `json:"execution,omitempty"`
	// Spot is the Run's effective spot policy, resolved at intake (the
	// request's, else its tenant's); empty is never.
	Spot SpotPolicy `json:"spot,omitempty"`
	// Attempts records the latest MaxAttemptRecords attempts: node,
	// cards, price, cost, outcome.
	Attempts []AttemptRecord `json:"attempts,omitempty"`
	// CostUSD is the sum of the attempts' cost so far.
	CostUSD float64 `json:"cost_usd,omitempty"`
	// Preemptions counts attempts ended by preemption (they do not count
	// toward the retry policy's max_attempts).
	Preemptions int `json:"preemptions,omitempty"`
	// Stopping is why the control plane is stopping the current attempt
	// other than a cancel (preempted, deadline_exceeded, budget_exceeded);
	// the attempt's end then moves the Run as that code says.
	Stopping Code `json:"stopping,omitempty"`

	// Progress is the latest transfer report (image or artifact) of the current attempt,
	// cleared when the attempt leaves preparing.
	Progress *TransferProgress `json:"progress,omitempty"`

	CancelRequested bool   `json:"cancel_requested,omitempty"`
	CancelReason    string `json:"cancel_reason,omitempty"`
	GraceSeconds    int64  `json:"grace_seconds,omitempty"`

	ExitCode  *int   `json:"exit_code,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	Reason    string `json:"reason,omitempty"` // coded reason for failed/lost/cancelled

	// StartedAt and FinishedAt are the node's own clock (invariant 7).
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`

	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// PhaseSince is when the control plane recorded the current phase.
	PhaseSince time.Time `json:"phase_since"`
	// EventSeq numbers this Run's events; it makes each event's Nats-Msg-Id
	// unique and stable across a redelivered transition.
	EventSeq uint64 `json:"event_seq"`
	// Outbox holds the events of the latest change. They are written with the
	// change itself and published after it, with Nats-Msg-Id run:seq, so a
	// crash between the two is repaired by publishing them again.
	Outbox []RunEvent `json:"outbox,omitempty"`
}

// WorkloadID names the container for one attempt of a Run on a node.
func WorkloadID(runID string, attempt int) string {
	return runID + "-a" + strconv.Itoa(attempt)
}

// CancelRun asks the control plane to stop a Run. Either RunID or RequestID
// names it.
type CancelRun struct {
	Version      int    `json:"version,omitempty"`
	RunID        string `json:"run_id,omitempty"`
	RequestID    string `json:"request_id,omitempty"`
	Reason       string `json:"reason,omitempty"`
	GraceSeconds int64  `json:"grace_seconds,omitempty"`
}

// Validate checks a CancelRun sent under tenant and resolves RunID from
// RequestID (request ids are per tenant).
func (c *CancelRun) Validate(tenant string) error {
	if c.Version < 0 || c.Version > SchemaVersion {
		return refuse(CodeUnsupportedVersion, "version", "version %d is not supported; this control plane speaks %d", c.Version, SchemaVersion)
	}
	if c.RunID == "" && c.RequestID == "" {
		return refuse(CodeMissingField, "run_id", "name the Run by run_id or request_id")
	}
	if c.RunID != "" {
		if err := ValidateID("run_id", c.RunID, CodeInvalidRunID); err != nil {
			return err
		}
	}
	if c.RequestID != "" {
		if err := ValidateID("request_id", c.RequestID, CodeInvalidRequestID); err != nil {
			return err
		}
		if c.RunID == "" {
			c.RunID = RunIDFor(tenant, c.RequestID)
		} else if c.RunID != RunIDFor(tenant, c.RequestID) {
			return refuse(CodeInvalidRunID, "run_id", "run_id and request_id name different Runs; send one of them")
		}
	}
	if c.GraceSeconds < 0 || c.GraceSeconds > MaxGraceSeconds {
		return refuse(CodeInvalidGrace, "grace_seconds", "must be between 0 (default %ds) and %d", DefaultGraceSeconds, MaxGraceSeconds)
	}
	if len(c.Reason) > 512 {
		return refuse(CodeValueTooLong, "reason", "at most 512 bytes")
	}
	return nil
}

// TenantOf is the Run's tenant, DefaultTenant for a record stored before
// Runs recorded one.
func (r Run) TenantOf() string {
	if r.Tenant == "" {
		return DefaultTenant
	}
	return r.Tenant
}
