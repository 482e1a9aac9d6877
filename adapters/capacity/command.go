package capacity

import (
	"github.com/warmfleet/warmfleet/schemas"
)

// MaxRefBytes bounds native references and offer ids; they travel in URLs,
// KV records and events.
const MaxRefBytes = 512

// Ref names one machine at one provider connection.
type Ref struct {
	ConnectionID string `json:"connection_id,omitempty"`
	RentalID     string `json:"rental_id,omitempty"`
	// NativeRef is the provider's own identifier for the machine.
	NativeRef string `json:"native_ref"`
	// OwnershipToken proves the machine belongs to this deployment. An
	// adapter acts only on machines that carry it, so a reconciler never
	// touches a machine that merely resembles ours.
	OwnershipToken string `json:"ownership_token"`
}

// OwnershipTokenFor is a connection's ownership token: token, or
// "warmfleet-<connection id>" when it is empty.
func OwnershipTokenFor(connectionID, token string) string {
	if token != "" {
		return token
	}
	return "warmfleet-" + connectionID
}

// Validate checks that r names a machine and carries an ownership token.
func (r Ref) Validate() error {
	if err := checkRef("native_ref", r.NativeRef); err != nil {
		return err
	}
	return checkID("ownership_token", r.OwnershipToken)
}

// ProvisionCommand asks for a fresh machine for one Rental.
type ProvisionCommand struct {
	ConnectionID string `json:"connection_id,omitempty"`
	// OperationKey names this provision; repeating it never allocates twice.
	OperationKey string `json:"operation_key"`
	// RequestHash is a digest of the request the key was first used with,
	// so a provider (or adapter) can tell a retry from a key reused for a
	// different request.
	RequestHash string `json:"request_hash,omitempty"`
	// RentalID is assigned by the control plane before the provider answers,
	// so a machine whose creation response was lost is still found.
	RentalID string `json:"rental_id"`
	// Generation is the rental's lifecycle cycle, the fencing token for
	// every later command on this machine.
	Generation     uint64 `json:"generation"`
	OwnershipToken string `json:"ownership_token"`
	// OfferID is an Offer.ID from this provider's ListCapacity.
	OfferID   string            `json:"offer_id"`
	Resources schemas.Resources `json:"resources,omitzero"`
	// Bootstrap is what the machine's node agent needs to enroll. Adapters
	// deliver its JSON encoding byte for byte (user data, startup script,
	// a file) and never interpret it. It carries a single-use secret: it is
	// never logged and never echoed into an observation.
	Bootstrap schemas.NodeBootstrap `json:"-"`
	// Interruptible asks for spot capacity; honoured only under Support.Spot.
	Interruptible bool `json:"interruptible,omitempty"`
	// MaxLifetimeSeconds asks the provider to reclaim the machine after this
	// long, so lost capacity cannot bill forever. Zero means no limit;
	// honoured only under Support.MaxLifetime.
	MaxLifetimeSeconds int64 `json:"max_lifetime_seconds,omitempty"`
}

// Validate checks the fields every adapter relies on.
func (c ProvisionCommand) Validate() error {
	if err := checkID("operation_key", c.OperationKey); err != nil {
		return err
	}
	if err := checkID("rental_id", c.RentalID); err != nil {
		return err
	}
	if err := checkID("ownership_token", c.OwnershipToken); err != nil {
		return err
	}
	if c.Generation == 0 {
		return invalid("generation", "must be 1 or more")
	}
	if err := checkRef("offer_id", c.OfferID); err != nil {
		return err
	}
	if c.MaxLifetimeSeconds < 0 {
		return invalid("max_lifetime_seconds", "must be zero (no limit) or positive")
	}
	r := c.Resources
	if r.CPUMillis < 0 || r.MemoryBytes < 0 || r.GPUCount < 0 || r.DiskBytes < 0 {
		return invalid("resources", "must not be negative")
	}
	return nil
}

// Ref returns the reference a machine provisioned by c will answer to once
// its NativeRef is known.
func (c ProvisionCommand) Ref(nativeRef string) Ref {
	return Ref{ConnectionID: c.ConnectionID, RentalID: c.RentalID, NativeRef: nativeRef, OwnershipToken: c.OwnershipToken}
}

// Command acts on an existing machine: start, stop, terminate.
type Command struct {
	Ref
	OperationKey string `json:"operation_key,omitempty"`
	RequestHash  string `json:"request_hash,omitempty"`
	// Generation is the fencing token: under Support.GenerationFencing a
	// command older than the machine's generation is refused with
	// ErrStaleGeneration and never applied late.
	Generation uint64 `json:"generation"`
}

// Validate checks the reference and the generation.
func (c Command) Validate() error {
	if err := c.Ref.Validate(); err != nil {
		return err
	}
	if c.Generation == 0 {
		return invalid("generation", "must be 1 or more")
	}
	return nil
}

func invalid(field, msg string) *Error {
	return &Error{Code: CodeInvalid, Message: field + ": " + msg}
}

func checkID(field, v string) error {
	if err := schemas.ValidateID(field, v, schemas.CodeMalformed); err != nil {
		return &Error{Code: CodeInvalid, Message: field + ": must be 1-128 characters of [A-Za-z0-9._:-], starting with a letter or digit"}
	}
	return nil
}

func checkRef(field, v string) error {
	if v == "" {
		return invalid(field, "required")
	}
	if len(v) > MaxRefBytes {
		return invalid(field, "too long")
	}
	for i := 0; i < len(v); i++ {
		// Printable ASCII without spaces: refs go into URL paths and logs.
		if v[i] <= ' ' || v[i] >= 0x7f {
			return invalid(field, "must be printable ASCII without spaces")
		}
	}
	return nil
}
