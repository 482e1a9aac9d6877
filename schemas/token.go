package schemas

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"time"
)

// Tokens (an invitation's enrollment token, a node's session token, an
// artifact login's token) are 32 random bytes in unpadded base64url. What
// the control plane stores is a hash of one, never the token: enrollment
// writes it and the auth callout compares with it, so both read these.

// DefaultInviteTTL is how long an enrollment token is good for.
const DefaultInviteTTL = 15 * time.Minute

// TokenWellFormed reports whether t is a warmfleet token: 32 bytes in
// unpadded base64url (43 characters).
func TokenWellFormed(t string) bool {
	b, err := base64.RawURLEncoding.DecodeString(t)
	return err == nil && len(b) == 32
}

// TokenHash is how a token is kept: a node's session token in
// NodeRecord.SessionTokenHash, and the auth callout's copy of producer and
// operator tokens.
func TokenHash(t string) string { return "sha256:" + tokenKey(t) }

// InvitationKey is the wf_enroll key of an invitation's token.
func InvitationKey(t string) string { return tokenKey(t) }

// ArtifactGrantKey is the wf_artifact_grants key of a grant's token.
func ArtifactGrantKey(t string) string { return tokenKey(t) }

// tokenKey is the hex SHA-256 of a token.
func tokenKey(t string) string {
	s := sha256.Sum256([]byte(t))
	return hex.EncodeToString(s[:])
}
