package noderuntime

import "github.com/warmfleet/warmfleet/schemas"

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
}

// ImageResult reports what EnsureImage had to do.
type ImageResult struct {
	// AlreadyPresent is true when nothing had to be fetched or imported.
	AlreadyPresent bool
	// Source says where the content came from: "local", "archive", "registry".
	Source string
	// FetchedBytes counts bytes brought onto the machine by this call.
	FetchedBytes int64
}
