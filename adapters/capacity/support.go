package capacity

import "fmt"

// Idempotency names how a provider makes a repeated provision safe.
type Idempotency string

const (
	// IdempotencyOperationKey: the provider deduplicates on the caller's
	// OperationKey itself.
	IdempotencyOperationKey Idempotency = "operation_key"
	// IdempotencyNone: the provider has no key; the adapter lists the
	// machines it owns and answers with the one already carrying the key.
	// A provider declaring this must also declare ListOwned.
	IdempotencyNone Idempotency = "none"
)

// Support is what a provider can actually do. Every field is a promise the
// conformance suite checks against behaviour.
type Support struct {
	// Stop and Resume report whether a machine can be suspended and brought
	// back under the same identity. Stop without Resume only sheds cost by
	// destroying warmth.
	Stop   bool `json:"stop"`
	Resume bool `json:"resume"`
	// PersistentDisk reports whether a stopped machine keeps its disk, which
	// is what makes a resumed machine still warm.
	PersistentDisk bool `json:"persistent_disk"`
	// Spot reports whether the provider can allocate interruptible capacity.
	// Without it, ProvisionCommand.Interruptible is ignored and receipts say
	// Interruptible false.
	Spot bool `json:"spot"`
	// ExactPricing reports whether offer and receipt prices are the rate the
	// provider bills, rather than an estimate.
	ExactPricing bool `json:"exact_pricing"`
	// IdempotentProvision is how repeated provisions are made safe.
	IdempotentProvision Idempotency `json:"idempotent_provision"`
	// ListOwned reports whether ListOwnedCapacity works.
	ListOwned bool `json:"list_owned"`
	// ObserveAfterTerminate reports whether a terminated machine stays
	// observable (as StateTerminated). When false, ErrNotFound after a
	// terminate is confirmation rather than ambiguity.
	ObserveAfterTerminate bool `json:"observe_after_terminate"`
	// GenerationFencing reports whether a command stamped with an older
	// generation than the machine's is refused with ErrStaleGeneration.
	GenerationFencing bool `json:"generation_fencing"`
	// MaxLifetime reports whether ProvisionCommand.MaxLifetimeSeconds is
	// enforced on the provider's side, so lost capacity cannot bill forever
	// even when the control plane is gone.
	MaxLifetime bool `json:"max_lifetime"`
}

// Validate reports a Support that contradicts itself.
func (s Support) Validate() error {
	switch s.IdempotentProvision {
	case IdempotencyOperationKey:
	case IdempotencyNone:
		if !s.ListOwned {
			// Without a key and without a listing there is no way to find
			// the machine a lost response created.
			return fmt.Errorf("%w: idempotent_provision %q needs list_owned", ErrInvalid, s.IdempotentProvision)
		}
	default:
		return fmt.Errorf("%w: idempotent_provision %q is neither %q nor %q", ErrInvalid, s.IdempotentProvision, IdempotencyOperationKey, IdempotencyNone)
	}
	if s.Resume && !s.Stop {
		return fmt.Errorf("%w: resume without stop", ErrInvalid)
	}
	if s.PersistentDisk && !s.Stop {
		return fmt.Errorf("%w: persistent_disk without stop", ErrInvalid)
	}
	return nil
}

// EphemeralSupport is what a one-shot executor (ephemeral.Executor) can
// do, including the lifecycle facts that are weaker there than on rented
// machines. Every field is a promise the executor conformance suite checks.
type EphemeralSupport struct {
	// ReusableBetweenRuns is always false: it answers the reuse question
	// outright, and Validate refuses a claim otherwise.
	ReusableBetweenRuns bool `json:"reusable_between_runs"`
	// ObservableLocality: the executor can say what its environment
	// already holds. Without it locality there is unknown, not cold.
	ObservableLocality bool `json:"observable_locality"`
	// CancelQueued: an execution can be cancelled before it runs.
	CancelQueued bool `json:"cancel_queued"`
	// ProviderTTL: the provider reclaims an execution on its own after a
	// TTL the launch sets, which bounds the cost of a lost answer.
	ProviderTTL bool `json:"provider_ttl"`
	// IdempotentLaunch is how a repeated launch is made safe:
	// IdempotencyOperationKey (the provider dedupes on a key),
	// IdempotencyLaunchKey (the adapter puts a key in the request and
	// finds it again by ListOwned) or IdempotencyNone.
	IdempotentLaunch Idempotency `json:"idempotent_launch"`
	// ListOwned: ListOwned enumerates this deployment's executions.
	ListOwned bool `json:"list_owned"`
	// ExactPricing: the provider states a billable rate.
	ExactPricing bool `json:"exact_pricing"`
	// StandingPool: executions run on a pool the provider keeps (a
	// serverless endpoint's workers), so Release ends ours and Terminate
	// is unsupported.
	StandingPool bool `json:"standing_pool"`
}

// IdempotencyLaunchKey: the adapter puts a launch key in the request and
// finds a launch whose answer was lost by listing what it owns.
const IdempotencyLaunchKey Idempotency = "launch_key"

// Validate reports an EphemeralSupport that contradicts itself.
func (s EphemeralSupport) Validate() error {
	if s.ReusableBetweenRuns {
		return fmt.Errorf("%w: an ephemeral executor is never reusable between runs", ErrInvalid)
	}
	switch s.IdempotentLaunch {
	case IdempotencyOperationKey:
	case IdempotencyLaunchKey:
		if !s.ListOwned {
			return fmt.Errorf("%w: idempotent_launch %q needs list_owned", ErrInvalid, s.IdempotentLaunch)
		}
	case IdempotencyNone:
		if !s.ListOwned && !s.ProviderTTL {
			// Nothing would find, or end, what a lost answer launched.
			return fmt.Errorf("%w: idempotent_launch %q needs list_owned or provider_ttl", ErrInvalid, s.IdempotentLaunch)
		}
	default:
		return fmt.Errorf("%w: idempotent_launch %q is none of %q, %q, %q", ErrInvalid, s.IdempotentLaunch, IdempotencyOperationKey, IdempotencyLaunchKey, IdempotencyNone)
	}
	return nil
}
