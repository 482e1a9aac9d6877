package shadeform

import "github.com/warmfleet/warmfleet/adapters/capacity/apicall"

// EnvAPIKey is the environment variable New reads the key from when the
// Config names neither a key nor a file.
const EnvAPIKey = "SHADEFORM_API_KEY"

// APIKey holds a Shadeform API key; it never prints (apicall.Key).
type APIKey = apicall.Key

// NewAPIKey wraps a key, trimming surrounding whitespace.
func NewAPIKey(s string) APIKey { return apicall.NewKey(s) }
