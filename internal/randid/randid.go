// Package randid mints random identifiers and bearer tokens from
// crypto/rand: one place for the "n random bytes, encoded" that ids, lease
// holders and secrets are made of.
//
// crypto/rand.Read never fails (since Go 1.24 it crashes the program
// rather than return short), so neither does anything here.
package randid

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
)

// Hex returns prefix followed by n random bytes in lowercase hex (2n
// characters): an identifier such as "rt-" + 12 hex digits.
func Hex(prefix string, n int) string {
	return prefix + hex.EncodeToString(Bytes(n))
}

// Token returns n random bytes as unpadded base64url: a bearer secret
// that travels in URLs, headers and files as is.
func Token(n int) string {
	return base64.RawURLEncoding.EncodeToString(Bytes(n))
}

// Bytes returns n random bytes.
func Bytes(n int) []byte {
	b := make([]byte, max(n, 0))
	_, _ = rand.Read(b) // never fails: see the package doc
	return b
}
