package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// errDigestMismatch is a put whose bytes do not hash to --digest.
var errDigestMismatch = errors.New("the file does not match --digest")

// uploadArtifact streams r into the artifact bucket as object
// sha256/<hex> with bus.PutObject, hashing as it goes. With want set,
// bytes that hash to another digest are discarded and errDigestMismatch
// returned (wrapped with a refusal). progress, if set, is called with the
// bytes sent so far.
func uploadArtifact(ctx context.Context, nc *nats.Conn, r io.Reader, want string, progress func(done int64)) (bus.ObjectStored, error) {
	bucket := bus.ObjectBucketArtifacts
	up, err := bus.PutObject(ctx, nc, bus.ObjectPut{Bucket: bucket, Description: "warmfleet artifact content", Want: want, Progress: progress}, r)
	var mismatch *bus.ObjectDigestError
	switch {
	case errors.As(err, &mismatch):
		return up, fmt.Errorf("%w: %w", errDigestMismatch, &schemas.Refusal{Code: schemas.CodeArtifactDigestMismatch, Field: "--digest",
			Reason: fmt.Sprintf("the file's %d bytes hash to %s, not %s; nothing was stored: check the file, or drop --digest", mismatch.Size, mismatch.Got, mismatch.Want)})
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return up, fmt.Errorf("%w (is the control plane provisioned? `warmfleet serve` makes it)", err)
	}
	return up, err
}
