package noderuntime

import (
	"context"
	"errors"

	"github.com/warmfleet/warmfleet/schemas"
)

// ImageSpec names an image by the manifest (or index) digest a Run is pinned to.
type ImageSpec struct {
	// Reference is the full reference, name@sha256:<hex>.
	Reference string
	// ManifestDigest is "sha256:<hex>", the identity of the image.
	ManifestDigest string
	// Platform is the build of a multi-platform image to fetch and unpack,
	// and nothing else of the index; nil is the runtime's own platform. An
	// image without that build fails with ErrPlatformNotInImage.
	Platform *schemas.Platform
	Unpack   bool
	// Progress, when set, is told how many bytes have been fetched or
	// imported so far, and of how many (0 while unknown). It may be called
	// from another goroutine, and never after EnsureImage returns.
	Progress func(done, total int64)
	// Credentials, when set, is asked for the credential of registry host
	// (as the runtime sees it, e.g. registry-1.docker.io) when, and only
	// when, the registry demands one during a pull of Reference: never for
	// an image already present or imported from an archive. The runtime
	// holds the answer for that pull only and never logs it. An error
	// fails the pull with ErrRegistryAuth. Nil pulls anonymously.
	Credentials func(ctx context.Context, host string) (RegistryCredential, error)
}

// RegistryCredential is one registry's credential as the control plane
// answers it (schemas.RegistryCredential): a password for a user, an
// identity token (no user), or anonymous.
type RegistryCredential = schemas.RegistryCredential

// ErrRegistryAuth reports a pull the registry refused (401 or 403) with
// the credential given, or with none, or whose credential could not be
// had (ImageSpec.Credentials failed). Its message names the registry and
// never a secret. Another node would be refused alike.
var ErrRegistryAuth = errors.New("registry refused the pull")

// ImageResult reports what EnsureImage had to do.
type ImageResult struct {
	// AlreadyPresent is true when nothing had to be fetched or imported.
	AlreadyPresent bool
	// Source says where the content came from: "local", "archive", "registry".
	Source string
	// FetchedBytes counts bytes brought onto the machine by this call.
	FetchedBytes int64
}
