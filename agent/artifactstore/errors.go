package artifactstore

import (
	"errors"
	"fmt"
)

// Errors the store and its sources return, wrapped with the digest and
// what happened; test them with errors.Is.
var (
	// ErrNoResume: a Source cannot continue from the offset asked; the
	// store discards the partial and starts again from 0.
	ErrNoResume = errors.New("source cannot resume")
	// ErrDigestMismatch: the bytes did not hash to the artifact's digest
	// (or the source's own record names another digest). They are
	// discarded, never used.
	ErrDigestMismatch = errors.New("artifact digest mismatch")
	// ErrSizeMismatch: the bytes are not the artifact's size. It is also
	// a digest mismatch (errors.Is(err, ErrDigestMismatch) holds).
	ErrSizeMismatch = errors.New("artifact size mismatch")
	// ErrSourceAuth: the source refused the credential (HTTP 401/403, a
	// NATS permission violation).
	ErrSourceAuth = errors.New("artifact source refused the credential")
	// ErrInUse: the replica is held by a workload or being fetched.
	ErrInUse = errors.New("artifact replica in use")
	// ErrNotFound: no such replica, or the source has no such content.
	ErrNotFound = errors.New("artifact not found")
)

// sizeMismatch is ErrSizeMismatch that is also ErrDigestMismatch.
type sizeMismatch struct{ msg string }

func (e *sizeMismatch) Error() string { return e.msg }

func (e *sizeMismatch) Is(target error) bool {
	return target == ErrSizeMismatch || target == ErrDigestMismatch
}

func errSize(digest string, got, want int64) error {
	return &sizeMismatch{msg: fmt.Sprintf("artifact %s: got %d bytes, want %d: %v", digest, got, want, ErrSizeMismatch)}
}

// permanent marks a source error that retrying cannot fix (a 404, a
// malformed answer); the store gives up at once.
type permanent struct{ err error }

func (e *permanent) Error() string { return e.err.Error() }
func (e *permanent) Unwrap() error { return e.err }

// isPermanent reports whether a fetch error ends the fetch without retry.
func isPermanent(err error) bool {
	var p *permanent
	return errors.As(err, &p) || errors.Is(err, ErrSourceAuth) || errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrNotFound)
}
