package noderuntime

import (
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// WorkloadSpec is one container to run.
type WorkloadSpec struct {
	ID             string
	ImageReference string
	ManifestDigest string
	// Platform is the build to run, as ImageSpec.Platform; nil is the
	// runtime's own.
	Platform    *schemas.Platform
	Command     []string // entrypoint + args; empty means the image's own
	Env         []string // KEY=VALUE
	CPUMillis   int64    // 0 = unlimited
	MemoryBytes int64    // 0 = unlimited
	Labels      map[string]string
	// Devices are fully qualified CDI device names (vendor.com/class=name,
	// e.g. "nvidia.com/gpu=GPU-<uuid>") the container is given: they are
	// resolved against the host's CDI specs, reread at each Launch, and
	// their spec edits (device nodes, env, mounts, hooks) are applied to
	// its OCI spec. One that cannot be given fails Launch with an error
	// matching ErrDeviceUnavailable, and nothing runs: a workload never
	// starts without the devices it was booked. Empty gives none.
	Devices []string
	// Mounts are host directories bind-mounted into the container.
	Mounts []Mount
	// Network is the workload's network (network.go); empty is NetworkNone.
	Network NetworkMode
	// ShmBytes sizes /dev/shm; 0 is DefaultShmBytes(MemoryBytes).
	ShmBytes int64
	// MemlockUnlimited lifts RLIMIT_MEMLOCK, which pinned device memory
	// (CUDA, RDMA) needs. Ulimits may still name memlock and win.
	MemlockUnlimited bool
	// Ulimits are the workload's resource limits by name (limits.go).
	Ulimits []Ulimit
	// Output says where the workload's stdout and stderr are kept on the
	// node and how fast (package nodelog's layout).
	Output Output
	// SecretEnv are environment variables whose values are the Run's
	// secrets, set in the process's environment before Env, whose
	// WARMFLEET_* variables win over a secret of the same name; SecretFiles
	// are files of secret contents the container sees read-only at their
	// paths with their modes, owned by its process's user. A runtime
	// must never persist them beyond the container's life nor put them in
	// its logs or errors: secret files live in memory (a tmpfs) that goes
	// when the workload is finished, removed or its launch undone, and a
	// restarted runtime removes any left over; secret env lives only in
	// the container's own spec, which goes with the container. Their
	// String names no value.
	SecretEnv   []schemas.SecretEnvValue
	SecretFiles []schemas.SecretFileValue
}

// Output is where a workload's output goes. The runtime's log writer keeps
// it in Dir (a directory of package nodelog's layout) while the workload
// runs, whether or not the agent is up; Finish makes it complete. The
// directory is the caller's: Remove leaves it. An empty Dir is the
// runtime's own choice, which Remove deletes.
type Output struct {
	Dir string
	// BytesPerSecond and Burst bound how fast output is kept, both streams
	// together; what exceeds them is dropped and a marker line says how
	// much. Zero keeps everything.
	BytesPerSecond int64
	Burst          int64
}

// Mount is a bind mount of a host directory, or of a regular file when
// ReadOnly (an artifact replica).
type Mount struct {
	Source   string // absolute host path
	Target   string // absolute path in the container
	ReadOnly bool
}

// WorkloadState is a runtime's view of one workload.
type WorkloadState string

// Workload states.
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
	// Devices are the CDI devices the workload was launched with, as the
	// runtime recorded them, so a restarted agent can tell what each
	// workload holds.
	Devices []string
	// ManifestDigest is the image the workload was launched from, as the
	// runtime recorded it: disk collection keeps it while the workload
	// exists.
	ManifestDigest string
}
