package schemas

import (
	"slices"
	"strconv"
	"strings"
)

// The container a Run gets beyond its image and resources: its network,
// the size of its /dev/shm and its process resource limits.

// Network modes of a Run (RunRequest.Network, LaunchWorkload.Network).
const (
	// NetworkBridge, the default: a network namespace of its own behind the
	// node's CNI bridge, with egress and the host's DNS servers.
	NetworkBridge = "bridge"
	// NetworkHost shares the node's network namespace (NCCL-style jobs).
	NetworkHost = "host"
	// NetworkNone isolates the Run: loopback only.
	NetworkNone = "none"
)

// NetworkModeOf is the mode a Network field asks for: NetworkBridge when
// it is empty.
func NetworkModeOf(network string) string {
	if network == "" {
		return NetworkBridge
	}
	return network
}

// MaxUlimits bounds a Run's ulimits: one per limit runc knows.
const MaxUlimits = 16

// UlimitUnlimited in a Ulimit's Soft or Hard means no limit (RLIM_INFINITY).
const UlimitUnlimited = -1

// Ulimit is one process resource limit of a Run's container.
type Ulimit struct {
	// Name is a limit runc sets, lowercase without RLIMIT_ (UlimitNames).
	Name string `json:"name"`
	Soft int64  `json:"soft"`
	Hard int64  `json:"hard"`
}

// UlimitNames are the limits a Ulimit may name: runc's RLIMIT_* set, in
// lowercase without the prefix.
func UlimitNames() []string {
	return []string{"as", "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue",
		"nice", "nofile", "nproc", "rss", "rtprio", "rttime", "sigpending", "stack"}
}

// validateNetwork checks a Network field; prefix is "" or "launch.".
func validateNetwork(prefix, network string) error {
	switch network {
	case "", NetworkBridge, NetworkHost, NetworkNone:
		return nil
	}
	return refuse(CodeInvalidNetwork, prefix+"network", `must be "bridge" (the default when empty), "host" or "none"`)
}

// validateShm checks shm_bytes against the memory limit it must fit in.
func validateShm(prefix string, shm, memory int64) error {
	field := prefix + "shm_bytes"
	switch {
	case shm < 0:
		return refuse(CodeInvalidShm, field, "must be zero (half the memory limit, or 1 GiB without one) or positive")
	case shm > MaxMemoryBytes:
		return refuse(CodeResourceTooLarge, field, "must be at most %d", int64(MaxMemoryBytes))
	case memory > 0 && shm > memory:
		return refuse(CodeInvalidShm, field, "must be at most resources.memory_bytes (%d): /dev/shm is memory the Run is charged for", memory)
	}
	return nil
}

// validateUlimits checks each limit's name, its values, and that no name
// appears twice.
func validateUlimits(prefix string, us []Ulimit) error {
	if len(us) > MaxUlimits {
		return refuse(CodeTooManyItems, prefix+"ulimits", "at most %d ulimits", MaxUlimits)
	}
	names := UlimitNames()
	seen := make(map[string]bool, len(us))
	for i, u := range us {
		field := prefix + "ulimits[" + strconv.Itoa(i) + "]"
		switch {
		case !slices.Contains(names, u.Name):
			return refuse(CodeInvalidUlimit, field+".name", "must be one of %s", strings.Join(names, ", "))
		case seen[u.Name]:
			return refuse(CodeInvalidUlimit, field+".name", "%s is given twice", u.Name)
		case u.Soft < UlimitUnlimited:
			return refuse(CodeInvalidUlimit, field+".soft", "must be zero or positive, or -1 for unlimited")
		case u.Hard < UlimitUnlimited:
			return refuse(CodeInvalidUlimit, field+".hard", "must be zero or positive, or -1 for unlimited")
		case ulimitAbove(u.Soft, u.Hard):
			return refuse(CodeInvalidUlimit, field+".soft", "must be at most hard (%d)", u.Hard)
		}
		seen[u.Name] = true
	}
	return nil
}

// ulimitAbove reports whether limit a exceeds limit b, -1 being infinite.
func ulimitAbove(a, b int64) bool {
	switch {
	case b == UlimitUnlimited:
		return false
	case a == UlimitUnlimited:
		return true
	}
	return a > b
}

// validateContainer checks the container fields of a RunRequest or a
// LaunchWorkload.
func validateContainer(prefix, network string, shm, memory int64, ulimits []Ulimit) error {
	if err := validateNetwork(prefix, network); err != nil {
		return err
	}
	if err := validateShm(prefix, shm, memory); err != nil {
		return err
	}
	return validateUlimits(prefix, ulimits)
}
