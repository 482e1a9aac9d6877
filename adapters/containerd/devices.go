package containerd

import (
	"context"
	"fmt"
	"strings"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/cdispec"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// labelDevices records the CDI devices a container was given (names joined
// by commas, which CDI names cannot hold), so a restarted agent can report
// what each workload holds.
const labelDevices = labelPrefix + "devices"

// checkDevices resolves devices against the host's CDI specs without
// creating anything, so a Launch that cannot give them fails before it
// makes a snapshot. Failures match noderuntime.ErrDeviceUnavailable.
func (r *Runtime) checkDevices(devices []string) error {
	if len(devices) == 0 {
		return nil
	}
	for _, d := range devices {
		if strings.Contains(d, ",") {
			return fmt.Errorf("%w: %w: %q", noderuntime.ErrDeviceUnavailable, cdispec.ErrInvalidName, d)
		}
	}
	probe := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{Resources: &specs.LinuxResources{}}}
	if err := r.cdi.Inject(probe, devices); err != nil {
		return fmt.Errorf("%w: %w", noderuntime.ErrDeviceUnavailable, err)
	}
	return nil
}

// withDevices applies the CDI edits of devices to the container's spec.
// It runs after the image config, so a device's env wins over the image's;
// the workload's own env (spec.Env, applied before it) is kept unless a
// device sets the same variable.
func (r *Runtime) withDevices(devices []string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if err := r.cdi.Inject(s, devices); err != nil {
			return fmt.Errorf("%w: %w", noderuntime.ErrDeviceUnavailable, err)
		}
		return nil
	}
}

// deviceLabel is the label value recording devices.
func deviceLabel(devices []string) string { return strings.Join(devices, ",") }

// labelledDevices reads the devices a container was given.
func labelledDevices(labels map[string]string) []string {
	v := labels[labelDevices]
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// removeSnapshot undoes the snapshot NewContainer made before it failed.
func (r *Runtime) removeSnapshot(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := r.client.SnapshotService(r.snapshotter).Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
		r.log.Warn("undo launch: remove snapshot", zap.String("snapshot", key), zap.Error(err))
	}
}
