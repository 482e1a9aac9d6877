package schemas

import "time"

// Scheduling policy vocabulary shared by producers (a RunRequest's
// priority, preemptible, retry and start deadline), the control plane's
// policy file (policy.go) and the Run record (attempts and their cost).

// Scheduling codes: why a Run waits, why an attempt ended, and refusals of
// scheduling input.
const (
	// CodeQuota: the Run's tenant is at a quota (and its cohort has none
	// to lend); it waits until one of the tenant's Runs ends.
	CodeQuota Code = "quota"
	// CodeBudget: the Run's tenant is past its budget for the period; it
	// waits for the next period (or a larger budget).
	CodeBudget Code = "budget"
	// CodePreempting: the Run waits for the Runs it preempted to stop.
	CodePreempting Code = "preempting"
	// CodePreempted: an attempt stopped to make room for a higher-priority
	// Run or to give lent quota back; the Run is requeued.
	CodePreempted Code = "preempted"
	// CodeRetryBackoff: a failed attempt is retried after its backoff.
	CodeRetryBackoff Code = "retry_backoff"
	// CodeDeadlineExceeded: the Run had not started by its
	// start_deadline_seconds.
	CodeDeadlineExceeded Code = "deadline_exceeded"
	// CodeBudgetExceeded: a running attempt stopped because its tenant
	// passed a budget whose policy stops running Runs.
	CodeBudgetExceeded Code = "budget_exceeded"
	// CodeInterrupted: the attempt's machine was taken away (a drain, a
	// retired or reclaimed rental) rather than lost.
	CodeInterrupted Code = "interrupted"

	CodePriorityUnknown Code = "priority_unknown"
	CodeInvalidPriority Code = "invalid_priority"
	CodeInvalidRetry    Code = "invalid_retry"
	CodeInvalidDeadline Code = "invalid_start_deadline"
	CodeInvalidPolicy   Code = "invalid_policy"
	// ReasonPenalised marks a candidate node an earlier attempt of the Run
	// failed on (a decision detail, not a refusal).
	ReasonPenalised Code = "penalised"
)

// RetryEvent names what may end an attempt and be retried.
type RetryEvent string

const (
	RetryExitNonZero  RetryEvent = "exit_nonzero"
	RetryOOM          RetryEvent = "oom"
	RetryNodeLost     RetryEvent = "node_lost"
	RetryInterrupted  RetryEvent = "interrupted"
	RetryLaunchFailed RetryEvent = "launch_failed"
)

// Limits on retry policies and deadlines.
const (
	MaxRetryAttempts        = 20
	MaxRetryBackoff         = time.Hour
	MaxStartDeadlineSeconds = 30 * 24 * 3600
	// MaxAttemptRecords bounds Run.Attempts: preempted attempts never
	// count against a retry policy, so only this keeps a Run's record
	// small. The oldest ended records go; their cost stays in
	// Run.CostUSD and WF_USAGE.
	MaxAttemptRecords = 64
)

// RetryPolicy says which attempt endings are retried and how often.
type RetryPolicy struct {
	// On lists the endings retried; an ending not listed ends the Run.
	On []RetryEvent `json:"on"`
	// MaxAttempts bounds the attempts that may end in a listed way,
	// counting the first (1 = never retry). Preempted attempts do not
	// count.
	MaxAttempts int `json:"max_attempts"`
	// Backoff is the wait before the first retry, a Go duration ("30s");
	// it doubles for each retry after, up to MaxRetryBackoff. Empty: none.
	Backoff string `json:"backoff,omitempty"`
}

// AttemptRecord is one attempt of a Run: where it ran, what it held, what
// it cost and how it ended. Times are the control plane's.
type AttemptRecord struct {
	Attempt int    `json:"attempt"`
	NodeID  string `json:"node_id"`
	// GPUs is how many cards the attempt holds; GPUModel their model.
	GPUs     int64  `json:"gpus,omitempty"`
	GPUModel string `json:"gpu_model,omitempty"`
	// PricePerHour is this attempt's share of its node's price (a rental's
	// price, or the policy's owned rate per GPU model × its cards), USD.
	PricePerHour float64 `json:"price_per_hour,omitempty"`
	// HeldFrom is when the attempt began to hold its place (booked, or
	// out of its node's queue); EndedAt when it stopped.
	HeldFrom *time.Time `json:"held_from,omitempty"`
	EndedAt  *time.Time `json:"ended_at,omitempty"`
	// Outcome is the code the attempt ended with ("" while it is current,
	// "succeeded" when it exited 0).
	Outcome Code    `json:"outcome,omitempty"`
	CostUSD float64 `json:"cost_usd,omitempty"`
}

// Victim is a Run a decision preempts, and why it was chosen.
type Victim struct {
	RunID    string `json:"run_id"`
	Tenant   string `json:"tenant,omitempty"`
	NodeID   string `json:"node_id"`
	Priority string `json:"priority,omitempty"`
	// GPUSeconds is the work the victim loses: its cards × how long it ran.
	GPUSeconds float64 `json:"gpu_seconds"`
	// Why: "priority" (a higher class needs the place) or "reclaim" (its
	// tenant borrowed quota the lender needs back).
	Why string `json:"why"`
}

// UsageRecord is one ended attempt's cost, published on
// wf.usage.<tenant> with Nats-Msg-Id usage:<attempt id>, summed by
// `warmfleet usage` and the budgets.
type UsageRecord struct {
	RunID     string    `json:"run_id"`
	Tenant    string    `json:"tenant"`
	AttemptID string    `json:"attempt_id"`
	NodeID    string    `json:"node_id"`
	GPUModel  string    `json:"gpu_model,omitempty"`
	GPUs      int64     `json:"gpus,omitempty"`
	HeldFrom  time.Time `json:"held_from"`
	EndedAt   time.Time `json:"ended_at"`
	Seconds   float64   `json:"seconds"`
	CostUSD   float64   `json:"cost_usd"`
	Outcome   Code      `json:"outcome,omitempty"`
}
