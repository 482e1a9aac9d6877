package shadeform

import (
	"fmt"
	"os"
	"strings"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// EnvAPIKey is the environment variable New reads the key from when the
// Config names neither a key nor a file.
const EnvAPIKey = "SHADEFORM_API_KEY"

const redacted = "[redacted]"

// APIKey holds a Shadeform API key. Every way of printing or encoding it
// (fmt verbs, JSON, text, zap) shows "[redacted]", so a key that reaches a
// log line or an error by accident still does not leak.
type APIKey struct{ secret string }

// NewAPIKey wraps a key, trimming surrounding whitespace (a key file
// usually ends in a newline).
func NewAPIKey(s string) APIKey { return APIKey{secret: strings.TrimSpace(s)} }

// IsZero reports whether no key is held.
func (k APIKey) IsZero() bool { return k.secret == "" }

// String, GoString, MarshalText and MarshalJSON never show the key.
func (k APIKey) String() string                { return redacted }
func (k APIKey) GoString() string              { return redacted }
func (k APIKey) MarshalText() ([]byte, error)  { return []byte(redacted), nil }
func (k APIKey) MarshalJSON() ([]byte, error)  { return []byte(`"` + redacted + `"`), nil }
func (k APIKey) reveal() string                { return k.secret }
func (k APIKey) redact(s string) string        { return redactSecret(s, k.secret) }
func (k APIKey) Format(f fmt.State, verb rune) { _, _ = f.Write([]byte(redacted)) }

// loadAPIKey picks the key: cfg.APIKey, else the file, else the
// environment. Errors name where it looked, never what it found.
func loadAPIKey(cfg Config) (APIKey, error) {
	if !cfg.APIKey.IsZero() {
		return cfg.APIKey, nil
	}
	if cfg.APIKeyFile != "" {
		data, err := os.ReadFile(cfg.APIKeyFile)
		if err != nil {
			// The path is not secret; the contents are never read into the error.
			return APIKey{}, &capacity.Error{Code: capacity.CodeUnauthorized, Provider: Type, Op: "configure",
				Message: "cannot read API key file " + cfg.APIKeyFile, Err: unwrapPathError(err)}
		}
		if k := NewAPIKey(string(data)); !k.IsZero() {
			return k, nil
		}
		return APIKey{}, &capacity.Error{Code: capacity.CodeUnauthorized, Provider: Type, Op: "configure",
			Message: "API key file " + cfg.APIKeyFile + " is empty"}
	}
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if k := NewAPIKey(getenv(EnvAPIKey)); !k.IsZero() {
		return k, nil
	}
	return APIKey{}, &capacity.Error{Code: capacity.CodeUnauthorized, Provider: Type, Op: "configure",
		Message: "no API key: set " + EnvAPIKey + " or give a key file"}
}

// unwrapPathError keeps the reason (not found, permission denied) and drops
// the *PathError wrapper so the path is not printed twice.
func unwrapPathError(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// redactSecret replaces every occurrence of secret in s, in any letter
// case (a provider that upper-cases what it echoes still leaks the key).
func redactSecret(s, secret string) string {
	n := len(secret)
	if n == 0 || len(s) < n {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		if i+n <= len(s) && strings.EqualFold(s[i:i+n], secret) {
			b.WriteString(redacted)
			i += n
			continue
		}
		b.WriteByte(s[i])
		i++
	}
	return b.String()
}
