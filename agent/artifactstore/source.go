package artifactstore

import (
	"context"
	"io"
)

// Source serves one artifact's bytes.
//
// Open returns the bytes from offset to the end. A Source that cannot start
// mid-way returns ErrNoResume for offset > 0, and the store starts over
// from 0. Open may be called again after a failed read; each call hands
// out a fresh reader, and the store closes every reader it is given.
type Source interface {
	Open(ctx context.Context, offset int64) (io.ReadCloser, error)
}
