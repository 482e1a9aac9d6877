package noderuntime

import (
	"context"
	"errors"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// Runtime is what a node needs from a container runtime on its host;
// adapters/containerd implements it. The idempotency rules each method keeps
// are in the package doc.
//
// Workload ids are chosen by the caller (the agent uses one per Run attempt)
// and are the runtime's container id, so a repeated launch of the same id is
// detectable.
type Runtime interface {
	// Info names the runtime and its daemon's version, for facts.
	Info(ctx context.Context) (RuntimeInfo, error)
	// EnsureImage makes the image pinned by spec.ManifestDigest present and,
	// when spec.Unpack holds, unpacked. It is idempotent. An image found in
	// no source returns an error matching ErrImageNotFound.
	EnsureImage(ctx context.Context, spec ImageSpec) (ImageResult, error)
	// Launch creates and starts a workload. A workload id that already exists
	// returns an error matching ErrWorkloadExists and changes nothing.
	Launch(ctx context.Context, spec WorkloadSpec) (WorkloadStatus, error)
	// Wait blocks until the workload exits (or ctx ends) and returns its final
	// status. It works for a workload started by an earlier agent process.
	Wait(ctx context.Context, id string) (WorkloadStatus, error)
	// Inspect reports a workload's current status; ErrWorkloadNotFound when
	// the runtime holds no such workload.
	Inspect(ctx context.Context, id string) (WorkloadStatus, error)
	// Stop signals SIGTERM, waits up to grace, then SIGKILLs. Stopping an
	// exited workload is not an error.
	Stop(ctx context.Context, id string, grace time.Duration) error
	// Finish makes an exited workload's output complete: once it returns,
	// every byte the workload wrote is in its output directory and the log
	// writer has marked it done. The workload stays (Inspect and Wait
	// report its exit) until Remove. A running workload is an error;
	// finishing one already finished is not.
	Finish(ctx context.Context, id string) error
	// Remove deletes the workload's task, container and snapshot.
	Remove(ctx context.Context, id string) error
	// List returns every workload this agent's runtime namespace holds.
	List(ctx context.Context) ([]WorkloadStatus, error)
	// Images reports every image this agent's runtime namespace holds, one
	// entry per digest it was pulled or imported by, as verified now.
	Images(ctx context.Context) ([]schemas.ImageLocality, error)
	// ImageUsage reports, for every image Images lists, the bytes it holds
	// on disk and when it was last used (EnsureImage or Launch), a time
	// kept in the runtime so it survives agent restarts.
	ImageUsage(ctx context.Context) ([]ImageUse, error)
	// RemoveImage deletes every name of the image pinned by manifestDigest
	// and the content and unpacked layers no other image shares, and
	// returns once they are gone from disk. Removing an image the runtime
	// does not hold is not an error (Freed is zero). It does not check
	// whether a workload uses the image: that is the caller's to know.
	RemoveImage(ctx context.Context, manifestDigest string) (RemovedImage, error)
}

// ImageUse is one image's footprint on the node's disk.
type ImageUse struct {
	ManifestDigest string
	// SizeBytes is its content plus its unpacked layers; layers shared
	// with another image count in both.
	SizeBytes int64
	// LastUsedAt is the last EnsureImage or Launch of it; when the runtime
	// has no record of one, when the image was stored.
	LastUsedAt time.Time
}

// RemovedImage says what RemoveImage freed.
type RemovedImage struct {
	// Freed is the bytes of content and unpacked layers deleted (shared
	// ones stay and are not counted).
	Freed int64
}

// Errors a Runtime returns, matched with errors.Is.
var (
	ErrWorkloadExists   = errors.New("workload already exists")
	ErrWorkloadNotFound = errors.New("workload not found")
	// ErrWorkloadRunning: an operation that needs the workload to have
	// exited (Finish) found it running.
	ErrWorkloadRunning = errors.New("workload still running")
	ErrImageNotFound   = errors.New("image not found in any source")
	// ErrDeviceUnavailable: a WorkloadSpec device the host cannot give
	// (not a valid CDI name, declared by no usable CDI spec, or its edits
	// cannot be applied).
	ErrDeviceUnavailable = errors.New("device unavailable")
	// ErrPlatformNotInImage: the image has no build for the platform asked
	// for (an index without it, or a single manifest of another platform).
	ErrPlatformNotInImage = errors.New("image has no build for the platform")
)

// RuntimeInfo identifies the container runtime for host facts.
type RuntimeInfo struct {
	Name    string // e.g. "containerd"
	Version string // the daemon's own version string
	// ExactImageInventory: Images lists every image and layer digest held,
	// rather than guessing.
	ExactImageInventory bool
	// BindMounts: WorkloadSpec.Mounts are honoured (cache mounts need them).
	BindMounts bool
	// Platform is the build this runtime runs when none is named, variant
	// included where it knows one; zero when it does not say.
	Platform schemas.Platform
}
