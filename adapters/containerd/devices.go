package containerd

import (
	"context"
	"fmt"
	"strings"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warmfleet/warmfleet/adapters/cdispec"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// labelDevices records the CDI devices a container was given (names joined
// by commas, which CDI names cannot hold), so a restarted agent can report
// what each workload holds.
const labelDevices = labelPrefix + "devices"

// devices gives workloads the devices their specs name, as the host's CDI
// specs describe them.
type devices struct {
	cdi *cdispec.Registry
}

// check resolves names against the host's CDI specs without creating
// anything, so a Launch that cannot give them fails before it makes a
// snapshot. Failures match noderuntime.ErrDeviceUnavailable.
func (d devices) check(names []string) error {
	if len(names) == 0 {
		return nil
	}
	for _, name := range names {
		if strings.Contains(name, ",") {
			return fmt.Errorf("%w: %w: %q", noderuntime.ErrDeviceUnavailable, cdispec.ErrInvalidName, name)
		}
	}
	probe := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{Resources: &specs.LinuxResources{}}}
	if err := d.cdi.Inject(probe, names); err != nil {
		return fmt.Errorf("%w: %w", noderuntime.ErrDeviceUnavailable, err)
	}
	return nil
}

// opts applies the CDI edits of the devices names to the container's
// spec; none when no device is named. They run after the image config,
// so a device's env wins over the image's; the workload's own env
// (spec.Env, applied before it) is kept unless a device sets the same
// variable.
func (d devices) opts(names []string) []oci.SpecOpts {
	if len(names) == 0 {
		return nil
	}
	return []oci.SpecOpts{func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if err := d.cdi.Inject(s, names); err != nil {
			return fmt.Errorf("%w: %w", noderuntime.ErrDeviceUnavailable, err)
		}
		return nil
	}}
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
