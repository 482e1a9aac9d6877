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
