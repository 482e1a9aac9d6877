// Package ephemeral owns the ephemeral lane's contract: an Executor runs
// one attempt of one Run as a one-shot execution on a provider's product
// (a serverless queue endpoint, a standing pool of workers), where nothing
// is reused between Runs and nothing enrolls. The control plane launches,
// observes, releases and reconciles executions through it without knowing
// which provider it is.
//
// It is written from what goes wrong there: a launch's answer gets lost
// after the provider queued it (neither RunPod serverless nor Modal
// documents an idempotency key), so every launch carries a LaunchKey chosen
// before it is sent and an executor declares how a lost one is found again
// (Support.IdempotentLaunch, ListOwned) or bounded (ProviderTTL); what the
// environment holds is usually not observable, so locality there is
// unknown, not cold; and a standing pool is not ours to destroy, so Release
// ends our execution and Terminate is unsupported.
package ephemeral

import (
	"context"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/schemas"
)

// Executor runs executions for one connection. Implementations are safe
// for concurrent use and respect ctx. Errors carry a capacity code where
// the outcome is known; an uncoded error means it is unknown (a lost
// answer) and the caller reconciles before assuming nothing happened.
type Executor interface {
	// Support reports what the executor can do.
	Support() capacity.EphemeralSupport
	// Verify is a cheap credential and reachability check.
	Verify(ctx context.Context) error
	// ListOffers lists where a Run matching q could execute.
	ListOffers(ctx context.Context, q OfferQuery) ([]Offer, error)
	// Launch queues one execution. Repeating it with the same LaunchKey
	// never runs a second one when Support says the key is honoured
	// (directly, or found again through ListOwned): the answer is then
	// Duplicate.
	Launch(ctx context.Context, req LaunchRequest) (LaunchReceipt, error)
	// Observe reports one execution now, with its output once it ended.
	Observe(ctx context.Context, ref Ref) (Execution, error)
	// Release ends our execution, queued or running (a cancel); releasing
	// one already ended succeeds.
	Release(ctx context.Context, ref Ref) (Receipt, error)
	// Terminate destroys a one-shot resource created for the execution;
	// standing-pool executors return capacity.ErrUnsupported.
	Terminate(ctx context.Context, ref Ref) (Receipt, error)
	// ListOwned lists this deployment's executions (Support.ListOwned).
	ListOwned(ctx context.Context, q capacity.OwnershipQuery) ([]Owned, error)
}

// Offer is one place a Run can execute: an endpoint serving an image, its
// cards, rate and expected start.
type Offer struct {
	capacity.Offer
	// Image is the image (name@sha256:…) the place runs; a Run of another
	// image cannot execute there.
	Image string `json:"image"`
	// MaxRuntimeSeconds is the longest execution it allows (0: none).
	MaxRuntimeSeconds int64 `json:"max_runtime_seconds,omitempty"`
}

// OfferQuery narrows ListOffers.
type OfferQuery struct {
	Resources schemas.Resources       `json:"resources,omitzero"`
	GPU       *schemas.GPURequirement `json:"gpu,omitempty"`
	// Image is the Run's image; only places running it match.
	Image string `json:"image"`
}

// Matches reports whether o can take a Run of q.
func (q OfferQuery) Matches(o Offer) bool {
	return o.Image == q.Image && (capacity.OfferQuery{Resources: q.Resources, GPU: q.GPU, Interruptible: true}).Matches(o.Offer)
}

// LaunchRequest is one execution of one Run attempt.
type LaunchRequest struct {
	ConnectionID string `json:"connection_id"`
	// LaunchKey names this launch before it is sent (RunID and attempt);
	// the executor puts it in the request so a lost answer can be found.
	LaunchKey      string `json:"launch_key"`
	RunID          string `json:"run_id"`
	Attempt        int    `json:"attempt"`
	OwnershipToken string `json:"ownership_token"`
	OfferID        string `json:"offer_id"`
	// Input is what the execution is given: the Run's command, args and
	// (non-secret) environment.
	Input Input `json:"input"`
	// ExecutionTimeoutSeconds bounds the execution (the Run's
	// max_runtime_seconds); TTLSeconds bounds its whole life, queue
	// included, where the provider enforces one.
	ExecutionTimeoutSeconds int64 `json:"execution_timeout_seconds,omitempty"`
	TTLSeconds              int64 `json:"ttl_seconds,omitempty"`
}

// Input is what an execution runs.
type Input struct {
	Command []string          `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
}

// Validate checks the request's names.
func (r LaunchRequest) Validate() error {
	for field, v := range map[string]string{"launch_key": r.LaunchKey, "run_id": r.RunID, "ownership_token": r.OwnershipToken, "offer_id": r.OfferID} {
		if err := schemas.ValidateID(field, v, schemas.CodeMalformed); err != nil {
			return capacity.Errorf(capacity.CodeInvalid, "%s: must be 1-128 characters of [A-Za-z0-9._:-]", field)
		}
	}
	if r.Attempt < 1 || r.ExecutionTimeoutSeconds < 0 || r.TTLSeconds < 0 {
		return capacity.Errorf(capacity.CodeInvalid, "attempt must be 1 or more, timeouts not negative")
	}
	return nil
}

// Ref names one execution.
type Ref struct {
	ConnectionID string `json:"connection_id"`
	// ExecutionID is the provider's id for it; OfferID where it runs.
	ExecutionID    string `json:"execution_id"`
	OfferID        string `json:"offer_id"`
	OwnershipToken string `json:"ownership_token"`
}

// Validate requires the ids.
func (r Ref) Validate() error {
	if r.ExecutionID == "" || r.OfferID == "" || r.OwnershipToken == "" {
		return capacity.Errorf(capacity.CodeInvalid, "execution_id, offer_id and ownership_token are required")
	}
	return nil
}

// State is where an execution is.
type State string

const (
	StateQueued    State = "queued"
	StateRunning   State = "running"
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
	StateCancelled State = "cancelled"
	// StateTimedOut: the provider ended it at its execution timeout or TTL.
	StateTimedOut State = "timed_out"
	StateUnknown  State = "unknown"
)

// Ended reports whether the execution will not change again.
func (s State) Ended() bool {
	switch s {
	case StateSucceeded, StateFailed, StateCancelled, StateTimedOut:
		return true
	}
	return false
}

// Valid reports whether s is one of the states above.
func (s State) Valid() bool {
	return s.Ended() || s == StateQueued || s == StateRunning || s == StateUnknown
}

// LaunchReceipt answers a launch.
type LaunchReceipt struct {
	ExecutionID string    `json:"execution_id"`
	State       State     `json:"state"`
	AcceptedAt  time.Time `json:"accepted_at"`
	// Duplicate: this LaunchKey had already launched; count it once.
	Duplicate bool `json:"duplicate"`
}

// Receipt answers a release or terminate.
type Receipt struct {
	ExecutionID string `json:"execution_id"`
	State       State  `json:"state"`
	Duplicate   bool   `json:"duplicate"`
}

// MaxOutputBytes bounds what an execution's output may hold.
const MaxOutputBytes = 64 << 10

// Execution is what the provider says of one execution.
type Execution struct {
	ExecutionID string    `json:"execution_id"`
	State       State     `json:"state"`
	ObservedAt  time.Time `json:"observed_at"`
	// QueueSeconds and RunSeconds are the provider's own account of its
	// wait and its run (zero when it gives none).
	QueueSeconds float64 `json:"queue_seconds,omitempty"`
	RunSeconds   float64 `json:"run_seconds,omitempty"`
	// Output is what an ended execution returned (JSON, at most
	// MaxOutputBytes; longer output is cut and Truncated set); Error the
	// provider's account of a failure.
	Output    []byte `json:"output,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	Error     string `json:"error,omitempty"`
}

// Owned is one execution this deployment launched.
type Owned struct {
	ExecutionID    string `json:"execution_id"`
	OfferID        string `json:"offer_id"`
	LaunchKey      string `json:"launch_key"`
	RunID          string `json:"run_id,omitempty"`
	OwnershipToken string `json:"ownership_token"`
	State          State  `json:"state"`
}
