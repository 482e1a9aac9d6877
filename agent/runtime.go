package agent

import (
	"context"
	"errors"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// Runtime is what the agent needs from a container runtime on its host. It is
// defined here, with its consumer; adapters/containerd implements it.
//
// Workload ids are chosen by the agent (one per Run attempt) and are the
// runtime's container id, so a repeated launch of the same id is detectable.
type Runtime interface {
	// Info names the runtime and its daemon's version, for facts.
	Info(ctx context.Context) (RuntimeInfo, error)
	// EnsureImage makes the image pinned by spec.ManifestDigest present and,
	// when spec.Unpack holds, unpacked. It is idempotent.
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
	// Remove deletes the workload's task, container and snapshot.
	Remove(ctx context.Context, id string) error
	// List returns every workload this agent's runtime namespace holds.
	List(ctx context.Context) ([]WorkloadStatus, error)
	// Images reports every image this agent's runtime namespace holds, one
	// entry per digest it was pulled or imported by, as verified now.
	Images(ctx context.Context) ([]schemas.ImageLocality, error)
}

// Errors a Runtime returns, matched with errors.Is.
var (
	ErrWorkloadExists   = errors.New("workload already exists")
	ErrWorkloadNotFound = errors.New("workload not found")
	ErrImageNotFound    = errors.New("image not found in any source")
)

// RuntimeInfo identifies the container runtime for host facts.
type RuntimeInfo struct {
	Name    string // e.g. "containerd"
	Version string // the daemon's own version string
}

// ImageSpec names an image by the manifest (or index) digest a Run is pinned to.
type ImageSpec struct {
	// Reference is the full reference, name@sha256:<hex>.
	Reference string
	// ManifestDigest is "sha256:<hex>", the identity of the image.
	ManifestDigest string
	Unpack         bool
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

// WorkloadSpec is one container to run.
type WorkloadSpec struct {
	ID             string
	ImageReference string
	ManifestDigest string
	Command        []string // entrypoint + args; empty means the image's own
	Env            []string // KEY=VALUE
	CPUMillis      int64    // 0 = unlimited
	MemoryBytes    int64    // 0 = unlimited
	Labels         map[string]string
	// Mounts are host directories bind-mounted into the container.
	Mounts []Mount
}

// Mount is a bind mount of a host directory.
type Mount struct {
	Source   string // absolute host path
	Target   string // absolute path in the container
	ReadOnly bool
}

// WorkloadState is a runtime's view of one workload.
type WorkloadState string

const (
	WorkloadCreated WorkloadState = "created"
	WorkloadRunning WorkloadState = "running"
	WorkloadExited  WorkloadState = "exited"
	WorkloadUnknown WorkloadState = "unknown"
)

// WorkloadStatus is a workload's state with times from this machine's clock.
type WorkloadStatus struct {
	ID         string
	State      WorkloadState
	Labels     map[string]string
	StartedAt  time.Time // zero until started
	FinishedAt time.Time // zero until exited
	ExitCode   int
	OOMKilled  bool
}
