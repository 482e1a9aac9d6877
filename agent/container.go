package agent

import (
	"slices"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// networkModes are the network modes this node gives Runs, as facts report
// them: configured (Config.NetworkModes), or every mode but host when that
// is nil, since a Run in the host's namespace reaches what the node does.
func networkModes(configured []string) []string {
	if configured != nil {
		return slices.Clone(configured)
	}
	var all []string
	for _, m := range noderuntime.AllNetworkModes() {
		if m != noderuntime.NetworkHost {
			all = append(all, string(m))
		}
	}
	return all
}

// offersNetwork reports whether a node configured with these modes gives a
// Run the network it asks for (empty is the default, bridge).
func offersNetwork(configured []string, network string) bool {
	return slices.Contains(networkModes(configured), schemas.NetworkModeOf(network))
}

// withContainer fills spec's network, /dev/shm and limits from l. A Run
// with GPUs gets memlock unlimited: CUDA and RDMA pin host memory.
func withContainer(spec *noderuntime.WorkloadSpec, l *schemas.LaunchWorkload) {
	spec.Network = noderuntime.NetworkMode(schemas.NetworkModeOf(l.Network))
	spec.ShmBytes = l.ShmBytes
	spec.MemlockUnlimited = l.Resources.GPUCount > 0
	for _, u := range l.Ulimits {
		spec.Ulimits = append(spec.Ulimits, noderuntime.Ulimit{Name: u.Name, Soft: rlimit(u.Soft), Hard: rlimit(u.Hard)})
	}
}

// rlimit converts a wire limit (-1 is unlimited) to the runtime's.
func rlimit(v int64) uint64 {
	if v == schemas.UlimitUnlimited {
		return noderuntime.Unlimited
	}
	return uint64(v)
}
