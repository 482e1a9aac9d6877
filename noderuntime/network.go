package noderuntime

// NetworkMode is the network a workload gets.
type NetworkMode string

// Network modes. A Run's default is NetworkBridge (schemas.NetworkBridge);
// a WorkloadSpec that names none gets NetworkNone, so a runtime never builds
// host networking nobody asked for.
const (
	// NetworkBridge is a network namespace of its own, attached to the node's
	// bridge, with an address, a default route through the bridge and the
	// host's DNS servers.
	NetworkBridge NetworkMode = "bridge"
	// NetworkHost shares the host's network namespace.
	NetworkHost NetworkMode = "host"
	// NetworkNone is a network namespace of its own with loopback only.
	NetworkNone NetworkMode = "none"
)

// AllNetworkModes lists every mode, in the order facts report them.
func AllNetworkModes() []NetworkMode {
	return []NetworkMode{NetworkBridge, NetworkHost, NetworkNone}
}
