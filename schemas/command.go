package schemas

import (
	"strconv"
	"time"
)

// CommandKind names what a Command asks a node to do.
type CommandKind string

const (
	CmdPrepareImage    CommandKind = "prepare_image"
	CmdPrepareArtifact CommandKind = "prepare_artifact"
	CmdLaunchWorkload  CommandKind = "launch_workload"
	CmdStopWorkload    CommandKind = "stop_workload"
	CmdReconcile       CommandKind = "reconcile"
)

// Command is what the control plane sends on wf.node.<id>.cmd. Exactly the
// payload named by Kind is set. OperationID makes it idempotent at the node
// (invariant 1); FencingToken and Generation make a superseded session's
// commands refusable (invariant 2).
type Command struct {
	Version      int         `json:"version,omitempty"`
	OperationID  string      `json:"operation_id"`
	NodeID       string      `json:"node_id"`
	FencingToken uint64      `json:"fencing_token"`
	Generation   uint64      `json:"generation"`
	Kind         CommandKind `json:"kind"`
	IssuedAt     time.Time   `json:"issued_at"`

	PrepareImage    *PrepareImage    `json:"prepare_image,omitempty"`
	PrepareArtifact *PrepareArtifact `json:"prepare_artifact,omitempty"`
	Launch          *LaunchWorkload  `json:"launch,omitempty"`
	Stop            *StopWorkload    `json:"stop,omitempty"`
}

// PrepareImage asks a node to hold an image's bytes, unpacked.
type PrepareImage struct {
	RunID string `json:"run_id,omitempty"`
	// PrefetchID is set instead of RunID when an operator's prefetch asks
	// for the image: the node reports its progress as ImageProgress.
	PrefetchID     string `json:"prefetch_id,omitempty"`
	AttemptID      string `json:"attempt_id,omitempty"`
	Reference      string `json:"reference"`
	ManifestDigest string `json:"manifest_digest"`
	Unpack         bool   `json:"unpack"`
	// Platform is the build of a multi-platform image to fetch (the Run's
	// platform); nil means the node's own.
	Platform *Platform `json:"platform,omitempty"`
}

// LaunchWorkload asks a node to start one attempt of a Run.
type LaunchWorkload struct {
	RunID string `json:"run_id"`
	// Tenant is the Run's: its output goes on the tenant's log subject
	// (bus.RunLogsSubject). Empty, from a control plane before tenants, is
	// DefaultTenant (TenantOf).
	Tenant         string `json:"tenant,omitempty"`
	AttemptID      string `json:"attempt_id"`
	Reference      string `json:"reference"`
	ManifestDigest string `json:"manifest_digest"`
	// Platform is the build to run, as PrepareImage's.
	Platform          *Platform    `json:"platform,omitempty"`
	Command           []string     `json:"command,omitempty"`
	Env               []EnvVar     `json:"env,omitempty"`
	Resources         Resources    `json:"resources"`
	MaxRuntimeSeconds int64        `json:"max_runtime_seconds,omitempty"`
	Caches            []CacheMount `json:"caches,omitempty"`
	// GPUs are the cards booked to the attempt, by UUID, and Devices the
	// CDI device names (e.g. nvidia.com/gpu=GPU-<uuid>) that hand them to
	// the container, in the same order.
	GPUs    []string `json:"gpus,omitempty"`
	Devices []string `json:"devices,omitempty"`
	// Network, ShmBytes and Ulimits are the RunRequest's (container.go).
	Network  string   `json:"network,omitempty"`
	ShmBytes int64    `json:"shm_bytes,omitempty"`
	Ulimits  []Ulimit `json:"ulimits,omitempty"`
	// Artifacts are mounted read-only from verified replicas; a launch
	// fetches any its prepare did not.
	Artifacts []ArtifactMount `json:"artifacts,omitempty"`
}

// TenantOf is the launch's tenant, DefaultTenant when unset.
func (l LaunchWorkload) TenantOf() string {
	if l.Tenant == "" {
		return DefaultTenant
	}
	return l.Tenant
}

// EnvVar is one environment binding.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// StopWorkload asks a node to stop an attempt: SIGTERM, GraceSeconds, SIGKILL.
type StopWorkload struct {
	RunID        string `json:"run_id"`
	AttemptID    string `json:"attempt_id"`
	GraceSeconds int64  `json:"grace_seconds"`
	Reason       string `json:"reason,omitempty"`
}

// Validate checks the envelope and that the payload matches Kind.
func (c *Command) Validate() error {
	if c.Version < 0 || c.Version > SchemaVersion {
		return refuse(CodeUnsupportedVersion, "version", "version %d is not supported", c.Version)
	}
	if err := ValidateID("operation_id", c.OperationID, CodeMalformed); err != nil {
		return err
	}
	if err := ValidateID("node_id", c.NodeID, CodeMalformed); err != nil {
		return err
	}
	if c.FencingToken == 0 {
		return refuse(CodeStaleFencingToken, "fencing_token", "a command must carry the fencing token of an enrollment (≥ 1)")
	}
	set := 0
	for _, p := range []bool{c.PrepareImage != nil, c.PrepareArtifact != nil, c.Launch != nil, c.Stop != nil} {
		if p {
			set++
		}
	}
	want := 1
	if c.Kind == CmdReconcile {
		want = 0
	}
	ok := set == want
	switch c.Kind {
	case CmdPrepareImage:
		ok = ok && c.PrepareImage != nil
	case CmdPrepareArtifact:
		ok = ok && c.PrepareArtifact != nil
	case CmdLaunchWorkload:
		ok = ok && c.Launch != nil
	case CmdStopWorkload:
		ok = ok && c.Stop != nil
	case CmdReconcile:
	default:
		return refuse(CodeMalformed, "kind", "unknown command kind")
	}
	if !ok {
		return refuse(CodeMalformed, string(c.Kind), "the payload must match kind and be the only one set")
	}
	if c.Launch != nil {
		if err := ValidateID("launch.attempt_id", c.Launch.AttemptID, CodeMalformed); err != nil {
			return err
		}
		if _, err := ParseImageRef("launch.reference", c.Launch.Reference); err != nil {
			return err
		}
		l := c.Launch
		// The tenant becomes a token of the output's subject.
		if l.Tenant != "" {
			if err := ValidateTenant("launch.tenant", l.Tenant); err != nil {
				return err
			}
		}
		if err := l.Platform.validate("launch.platform"); err != nil {
			return err
		}
		if err := validateContainer("launch.", l.Network, l.ShmBytes, l.Resources.MemoryBytes, l.Ulimits); err != nil {
			return err
		}
		// A GPU attempt names a CDI device for every card it holds, or it
		// would run without them.
		if len(l.Artifacts) > MaxArtifacts {
			return refuse(CodeTooManyItems, "launch.artifacts", "at most %d artifacts", MaxArtifacts)
		}
		for i := range l.Artifacts {
			if err := l.Artifacts[i].Validate("launch.artifacts[" + strconv.Itoa(i) + "]"); err != nil {
				return err
			}
		}
		if int64(len(l.GPUs)) != l.Resources.GPUCount || len(l.Devices) != len(l.GPUs) {
			return refuse(CodeMalformed, "launch.devices", "a launch needs one booked GPU and one CDI device per card of resources.gpu_count")
		}
	}
	if c.PrepareImage != nil {
		if _, err := ParseImageRef("prepare_image.reference", c.PrepareImage.Reference); err != nil {
			return err
		}
		if err := c.PrepareImage.Platform.validate("prepare_image.platform"); err != nil {
			return err
		}
		if id := c.PrepareImage.PrefetchID; id != "" {
			if err := ValidateID("prepare_image.prefetch_id", id, CodeMalformed); err != nil {
				return err
			}
		}
	}
	if p := c.PrepareArtifact; p != nil {
		if err := p.Validate(); err != nil {
			return err
		}
	}
	if c.Stop != nil {
		if err := ValidateID("stop.attempt_id", c.Stop.AttemptID, CodeMalformed); err != nil {
			return err
		}
	}
	return nil
}
