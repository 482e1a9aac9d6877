package capacity

import "time"

// Receipt is a provider's answer to a command it accepted.
type Receipt struct {
	NativeRef  string    `json:"native_ref"`
	State      State     `json:"state"`
	AcceptedAt time.Time `json:"accepted_at"`
	// Duplicate reports that this OperationKey (or, for stop, start and
	// terminate, this very transition) had already been accepted, so the
	// caller must not count the effect twice.
	Duplicate bool `json:"duplicate"`
	// Interruptible is what the provider actually allocated, which may
	// differ from what was asked.
	Interruptible bool  `json:"interruptible"`
	Pricing       Price `json:"pricing,omitzero"`
}

// Price is an hourly rate. Amounts are integers of a millionth of the
// currency unit so no provider's quote is rounded through a float.
type Price struct {
	// Currency is ISO 4217 ("USD"); empty when the provider stated none.
	Currency string `json:"currency,omitempty"`
	// MicrosPerHour is the rate in millionths of Currency per hour.
	MicrosPerHour int64 `json:"micros_per_hour"`
	// Exact reports that this is the rate billed, not an estimate.
	Exact bool `json:"exact"`
}

// MicrosPerCent converts a price quoted in cents.
const MicrosPerCent = 10_000
