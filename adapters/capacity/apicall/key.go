// Package apicall owns what every HTTP capacity adapter (shadeform,
// runpod) needs of a provider's API and would otherwise write twice: the
// API key that never prints, one request with a bounded answer, the
// mapping of an answer's status and text onto capacity's error codes, and
// a client that never follows a redirect off the API's host with the key.
package apicall

import (
	"fmt"
	"os"
	"strings"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

const redacted = "[redacted]"

// Key holds a provider API key. Every way of printing or encoding it (fmt
// verbs, JSON, text, zap) shows "[redacted]", so a key that reaches a log
// line or an error by accident still does not leak.
type Key struct{ secret string }

// NewKey wraps a key, trimming surrounding whitespace (a key file usually
// ends in a newline).
func NewKey(s string) Key { return Key{secret: strings.TrimSpace(s)} }

// IsZero reports whether no key is held.
func (k Key) IsZero() bool { return k.secret == "" }

// String, GoString, MarshalText, MarshalJSON and Format never show the key.
func (k Key) String() string                { return redacted }
func (k Key) GoString() string              { return redacted }
func (k Key) MarshalText() ([]byte, error)  { return []byte(redacted), nil }
func (k Key) MarshalJSON() ([]byte, error)  { return []byte(`"` + redacted + `"`), nil }
func (k Key) Format(f fmt.State, verb rune) { _, _ = f.Write([]byte(redacted)) }

// Reveal is the key itself, for the one header that carries it.
func (k Key) Reveal() string { return k.secret }

// Redact replaces the key wherever it appears in s, in any letter case.
func (k Key) Redact(s string) string { return redactSecret(s, k.secret) }

// KeySource says where a provider's key comes from: Key when set, else
// File, else the environment variable Env.
type KeySource struct {
	Provider string
	Key      Key
	File     string
	Env      string
	// Getenv reads the environment; os.Getenv when nil.
	Getenv func(string) string
}

// Load picks the key. Errors name where it looked, never what it found.
func (s KeySource) Load() (Key, error) {
	if !s.Key.IsZero() {
		return s.Key, nil
	}
	if s.File != "" {
		data, err := os.ReadFile(s.File)
		if err != nil {
			// The path is not secret; the contents are never read into the error.
			return Key{}, &capacity.Error{Code: capacity.CodeUnauthorized, Provider: s.Provider, Op: "configure",
				Message: "cannot read API key file " + s.File, Err: unwrapPathError(err)}
		}
		if k := NewKey(string(data)); !k.IsZero() {
			return k, nil
		}
		return Key{}, &capacity.Error{Code: capacity.CodeUnauthorized, Provider: s.Provider, Op: "configure",
			Message: "API key file " + s.File + " is empty"}
	}
	getenv := s.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if k := NewKey(getenv(s.Env)); !k.IsZero() {
		return k, nil
	}
	return Key{}, &capacity.Error{Code: capacity.CodeUnauthorized, Provider: s.Provider, Op: "configure",
		Message: "no API key: set " + s.Env + " or give a key file"}
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
