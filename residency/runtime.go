package residency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// Runtime is the part of noderuntime.Runtime a residency uses. Every
// noderuntime.Runtime (adapters/containerd's included) is one.
type Runtime interface {
	EnsureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error)
	Launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error)
	Inspect(ctx context.Context, id string) (noderuntime.WorkloadStatus, error)
	Stop(ctx context.Context, id string, grace time.Duration) error
	Remove(ctx context.Context, id string) error
}

var _ Runtime = noderuntime.Runtime(nil)

// RuntimeTarget is the session runtime this host launches.
type RuntimeTarget struct {
	// Image is name@sha256:<hex>; ManifestDigest its "sha256:<hex>".
	Image          string
	ManifestDigest string
	// Command is the entrypoint and args; empty runs the image's own.
	Command []string
	Env     []string
	// CompatibilityID names the runtime build. Durable state written by
	// another build is not restored here.
	CompatibilityID string
	// StopGrace is how long a release waits after SIGTERM; 2 s when zero.
	StopGrace time.Duration
	// WorkspaceMount is where the workspace appears in the container;
	// /workspace when empty.
	WorkspaceMount string
	CPUMillis      int64
	MemoryBytes    int64
	// RequiresCheckpoint refuses to resume a session whose durable state
	// holds no workspace checkpoint (ErrCheckpointRequired), rather than
	// start it on an empty workspace.
	RequiresCheckpoint bool
}

func (t RuntimeTarget) validate() error {
	switch {
	case t.Image == "" || t.ManifestDigest == "":
		return &InvalidOptionsError{Field: "Target.Image", Reason: "image reference and manifest digest are required"}
	case t.CompatibilityID == "":
		return &InvalidOptionsError{Field: "Target.CompatibilityID", Reason: "required"}
	}
	return nil
}

func (t RuntimeTarget) grace() time.Duration {
	if t.StopGrace > 0 {
		return t.StopGrace
	}
	return 2 * time.Second
}

// Labels on every residency workload.
const (
	LabelTenant  = noderuntime.LabelResidencyTenant
	LabelSession = noderuntime.LabelResidencySession
	LabelEpoch   = "warmfleet.residency/epoch"
	LabelHost    = "warmfleet.residency/host"
)

// WorkloadID is the container id of key's runtime under epoch. The epoch
// is part of it, so a successor's runtime never collides with a stale one.
func WorkloadID(key Key, epoch ResidencyEpoch) string {
	id := "res-" + key.Tenant + "-" + key.Session + "-e" + strconv.FormatUint(uint64(epoch), 10)
	if len(id) <= 76 {
		return id
	}
	h := sha256.Sum256([]byte(key.String()))
	return "res-" + hex.EncodeToString(h[:12]) + "-e" + strconv.FormatUint(uint64(epoch), 10)
}

func (t RuntimeTarget) spec(key Key, host string, epoch ResidencyEpoch, workspace, namespace string) noderuntime.WorkloadSpec {
	mount := t.WorkspaceMount
	if mount == "" {
		mount = "/workspace"
	}
	env := append([]string{
		"WF_TENANT=" + key.Tenant,
		"WF_SESSION=" + key.Session,
		"WF_NAMESPACE=" + namespace,
		"WF_LEASE_EPOCH=" + strconv.FormatUint(uint64(epoch), 10),
		"WF_COMPATIBILITY_ID=" + t.CompatibilityID,
	}, t.Env...)
	return noderuntime.WorkloadSpec{
		ID:             WorkloadID(key, epoch),
		ImageReference: t.Image,
		ManifestDigest: t.ManifestDigest,
		Command:        t.Command,
		Env:            env,
		CPUMillis:      t.CPUMillis,
		MemoryBytes:    t.MemoryBytes,
		Labels: map[string]string{
			LabelTenant: key.Tenant, LabelSession: key.Session,
			LabelEpoch: strconv.FormatUint(uint64(epoch), 10), LabelHost: host,
		},
		Mounts: []noderuntime.Mount{{Source: workspace, Target: mount}},
		// A session gets a Run's default network.
		Network: noderuntime.NetworkBridge,
	}
}

// launchRuntime ensures the image and launches the session's workload.
func launchRuntime(ctx context.Context, rt Runtime, spec noderuntime.WorkloadSpec) error {
	if _, err := rt.EnsureImage(ctx, noderuntime.ImageSpec{Reference: spec.ImageReference, ManifestDigest: spec.ManifestDigest, Unpack: true}); err != nil {
		return fmt.Errorf("residency: ensure image %s: %w", spec.ImageReference, err)
	}
	if _, err := rt.Launch(ctx, spec); err != nil {
		return fmt.Errorf("residency: launch %s: %w", spec.ID, err)
	}
	return nil
}

// releaseRuntime stops and removes a workload. One already gone is
// released.
func releaseRuntime(ctx context.Context, rt Runtime, id string, grace time.Duration) error {
	if err := rt.Stop(ctx, id, grace); err != nil && !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		return fmt.Errorf("residency: stop %s: %w", id, err)
	}
	if err := rt.Remove(ctx, id); err != nil && !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		return fmt.Errorf("residency: remove %s: %w", id, err)
	}
	return nil
}

// runtimeRunning reports whether the workload is still running.
func runtimeRunning(ctx context.Context, rt Runtime, id string) bool {
	st, err := rt.Inspect(ctx, id)
	return err == nil && st.State == noderuntime.WorkloadRunning
}
