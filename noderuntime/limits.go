package noderuntime

// Ulimit is one process resource limit (setrlimit), named as in
// schemas.UlimitNames ("nofile", "memlock", ...).
type Ulimit struct {
	Name string
	Soft uint64
	Hard uint64
}

// Unlimited is RLIM_INFINITY, the value of an unlimited Ulimit.
const Unlimited = ^uint64(0)

// DefaultShmBytes is the /dev/shm size of a workload that asks for none:
// half its memory limit, or 1 GiB without one.
func DefaultShmBytes(memoryBytes int64) int64 {
	if memoryBytes > 0 {
		return memoryBytes / 2
	}
	return 1 << 30
}
