package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// ErrInvalidUlimit reports a WorkloadSpec ulimit runc would not set: an
// unknown name, or a soft limit above the hard one.
var ErrInvalidUlimit = errors.New("invalid ulimit")

// limits puts a workload's limits in its spec, within what this host
// allows: its CPU and memory, /dev/shm's size and its process limits.
type limits struct {
	// memlockMax is what MemlockUnlimited gives (memlockCeiling).
	memlockMax uint64
	// swap says whether memory+swap can be capped (swapLimitSupported).
	swap bool
}

// newLimits finds this host's ceilings once; they hold for the process's
// life.
func newLimits(log *zap.Logger) (limits, error) {
	memlockMax, err := memlockCeiling()
	if err != nil {
		return limits{}, err
	}
	if memlockMax != noderuntime.Unlimited {
		log.Warn("without CAP_SYS_RESOURCE, workloads that need unlimited memlock get this process's own hard limit", zap.Uint64("memlock_bytes", memlockMax))
	}
	return limits{memlockMax: memlockMax, swap: swapLimitSupported()}, nil
}

// opts caps CPU and memory, sizes /dev/shm and sets the process limits:
// memlock as high as memlockMax when asked for unlimited or when the
// workload is given devices (GPU work pins memory), then each of
// spec.Ulimits over containerd's defaults. A ulimit runc would refuse is
// ErrInvalidUlimit.
func (l limits) opts(spec noderuntime.WorkloadSpec) ([]oci.SpecOpts, error) {
	opts := l.resources(spec)
	shm := spec.ShmBytes
	if shm <= 0 {
		shm = noderuntime.DefaultShmBytes(spec.MemoryBytes)
	}
	opts = append(opts, oci.WithDevShmSize((shm+1023)/1024))
	var rl []specs.POSIXRlimit
	if spec.MemlockUnlimited || len(spec.Devices) > 0 {
		rl = append(rl, specs.POSIXRlimit{Type: "RLIMIT_MEMLOCK", Soft: l.memlockMax, Hard: l.memlockMax})
	}
	for _, u := range spec.Ulimits {
		if !slices.Contains(schemas.UlimitNames(), u.Name) {
			return nil, fmt.Errorf("%w: unknown limit %q", ErrInvalidUlimit, u.Name)
		}
		if u.Soft > u.Hard {
			return nil, fmt.Errorf("%w: %s soft %d above hard %d", ErrInvalidUlimit, u.Name, u.Soft, u.Hard)
		}
		rl = append(rl, specs.POSIXRlimit{Type: "RLIMIT_" + strings.ToUpper(u.Name), Soft: u.Soft, Hard: u.Hard})
	}
	if len(rl) > 0 {
		opts = append(opts, withRlimits(rl))
	}
	return opts, nil
}

// CFS bandwidth limits, in µs: the kernel's default period, its longest,
// and the least quota a period gives a workload (minStartQuota).
const (
	cfsPeriod     = 100_000
	cfsMaxPeriod  = 1_000_000
	minStartQuota = 10_000
)

// cfsBandwidth is a cap of cpuMillis as CFS quota and period. A workload
// starts under its cap (runc's init finishes in the workload's cgroup and
// execs its command there), and a task that spends its quota waits for the
// next period: a 10-millicore cap, 1 ms per 100 ms, made the start wait
// out one or two periods (70–170 ms) on most launches in the e2e bench. So
// the quota is never under minStartQuota while the period can grow (to the
// kernel's 1 s): under 100 millicores the period lengthens, the average
// stays cpuMillis.
func cfsBandwidth(cpuMillis int64) (quota int64, period uint64) {
	if q := cpuMillis * cfsPeriod / 1000; q >= minStartQuota {
		return q, cfsPeriod
	}
	if p := minStartQuota * 1000 / cpuMillis; p <= cfsMaxPeriod {
		return minStartQuota, uint64(p)
	}
	return max(cpuMillis*cfsMaxPeriod/1000, 1000), cfsMaxPeriod // 1 ms: the kernel's least quota
}

// resources caps the workload's CPU time and memory.
func (l limits) resources(spec noderuntime.WorkloadSpec) []oci.SpecOpts {
	var opts []oci.SpecOpts
	if spec.CPUMillis > 0 {
		opts = append(opts, oci.WithCPUCFS(cfsBandwidth(spec.CPUMillis)))
	}
	if spec.MemoryBytes > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(spec.MemoryBytes)))
		if l.swap {
			// memory+swap == memory: the limit cannot be dodged by swapping,
			// so exceeding it is an OOM kill, not a slowdown.
			opts = append(opts, oci.WithMemorySwap(spec.MemoryBytes))
		}
	}
	return opts
}

// withRlimits sets each limit, replacing one of the same type; a later
// entry wins over an earlier one.
func withRlimits(rl []specs.POSIXRlimit) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		for _, r := range rl {
			i := slices.IndexFunc(s.Process.Rlimits, func(x specs.POSIXRlimit) bool { return x.Type == r.Type })
			if i < 0 {
				s.Process.Rlimits = append(s.Process.Rlimits, r)
				continue
			}
			s.Process.Rlimits[i] = r
		}
		return nil
	}
}

// memlockCeiling is the most RLIMIT_MEMLOCK this host lets a container
// have: unlimited where this process holds CAP_SYS_RESOURCE, else its own
// hard limit, which runc (started below containerd, as privileged as this
// process on one host) cannot raise either. Asking runc for more fails the
// launch with EPERM.
func memlockCeiling() (uint64, error) {
	if hasCapability(capSysResource) {
		return noderuntime.Unlimited, nil
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return 0, fmt.Errorf("memlock limit: %w", err)
	}
	return rl.Max, nil
}

// capSysResource is CAP_SYS_RESOURCE's bit in a capability set.
const capSysResource = 24

// hasCapability reports whether this process's effective set holds cap.
func hasCapability(capability uint) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			set, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && set&(1<<capability) != 0
		}
	}
	return false
}

// swapLimitSupported says whether runc can cap memory+swap. On cgroup v1
// that needs swap accounting (memory.memsw.*), which kernels may lack; runc
// fails the start if asked for it then. On v2 runc skips it when absent.
func swapLimitSupported() bool {
	if isCgroup2(cgroupRoot) {
		return true
	}
	_, err := os.Stat(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes"))
	return err == nil
}
