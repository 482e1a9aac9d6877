package containerd

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// TestLimitOpts checks the spec limits.opts builds over containerd's
// default one, without a daemon.
func TestLimitOpts(t *testing.T) {
	gen := func(spec noderuntime.WorkloadSpec) *oci.Spec {
		t.Helper()
		opts, err := limits{memlockMax: noderuntime.Unlimited}.opts(spec)
		if err != nil {
			t.Fatal(err)
		}
		s, err := oci.GenerateSpec(namespaces.WithNamespace(context.Background(), "test"), nil, &containers.Container{ID: "w"}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	shm := func(s *oci.Spec) string {
		for _, m := range s.Mounts {
			if m.Destination == "/dev/shm" {
				for _, o := range m.Options {
					if strings.HasPrefix(o, "size=") {
						return o
					}
				}
			}
		}
		return ""
	}
	rlimit := func(s *oci.Spec, typ string) *specs.POSIXRlimit {
		for i, r := range s.Process.Rlimits {
			if r.Type == typ {
				return &s.Process.Rlimits[i]
			}
		}
		return nil
	}

	for _, c := range []struct {
		spec noderuntime.WorkloadSpec
		want string
	}{
		{noderuntime.WorkloadSpec{}, "size=1048576k"},                                       // 1 GiB without a memory limit
		{noderuntime.WorkloadSpec{MemoryBytes: 1 << 30}, "size=524288k"},                    // half the memory limit
		{noderuntime.WorkloadSpec{MemoryBytes: 1 << 30, ShmBytes: 64 << 20}, "size=65536k"}, // asked for
		{noderuntime.WorkloadSpec{ShmBytes: 1000}, "size=1k"},                               // rounded up to KiB
	} {
		if got := shm(gen(c.spec)); got != c.want {
			t.Errorf("shm of %+v = %q, want %q", c.spec, got, c.want)
		}
	}

	plain := gen(noderuntime.WorkloadSpec{})
	if rlimit(plain, "RLIMIT_MEMLOCK") != nil {
		t.Error("memlock set without being asked for")
	}
	s := gen(noderuntime.WorkloadSpec{MemlockUnlimited: true, Ulimits: []noderuntime.Ulimit{{Name: "nofile", Soft: 4096, Hard: 8192}, {Name: "core", Soft: 0, Hard: 0}}})
	if r := rlimit(s, "RLIMIT_MEMLOCK"); r == nil || r.Soft != noderuntime.Unlimited || r.Hard != noderuntime.Unlimited {
		t.Errorf("memlock %+v, want unlimited", r)
	}
	if r := rlimit(s, "RLIMIT_NOFILE"); r == nil || r.Soft != 4096 || r.Hard != 8192 {
		t.Errorf("nofile %+v, want 4096/8192 in place of containerd's default", r)
	}
	if n := slices.IndexFunc(s.Process.Rlimits, func(r specs.POSIXRlimit) bool { return r.Type == "RLIMIT_NOFILE" }); n < 0 ||
		slices.ContainsFunc(s.Process.Rlimits[n+1:], func(r specs.POSIXRlimit) bool { return r.Type == "RLIMIT_NOFILE" }) {
		t.Errorf("nofile set twice: %+v", s.Process.Rlimits)
	}
	if r := rlimit(s, "RLIMIT_CORE"); r == nil || r.Soft != 0 {
		t.Errorf("core %+v", r)
	}
	// Without CAP_SYS_RESOURCE, "unlimited" is the ceiling the host allows.
	opts, err := limits{memlockMax: 8 << 20}.opts(noderuntime.WorkloadSpec{MemlockUnlimited: true})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := oci.GenerateSpec(namespaces.WithNamespace(context.Background(), "test"), nil, &containers.Container{ID: "w"}, opts...); err != nil {
		t.Fatal(err)
	} else if r := rlimit(s, "RLIMIT_MEMLOCK"); r == nil || r.Soft != 8<<20 || r.Hard != 8<<20 {
		t.Errorf("memlock under a ceiling %+v, want 8 MiB", r)
	}
	// An explicit memlock wins over MemlockUnlimited.
	s = gen(noderuntime.WorkloadSpec{MemlockUnlimited: true, Ulimits: []noderuntime.Ulimit{{Name: "memlock", Soft: 1 << 20, Hard: 1 << 20}}})
	if r := rlimit(s, "RLIMIT_MEMLOCK"); r == nil || r.Hard != 1<<20 {
		t.Errorf("memlock %+v, want the explicit 1 MiB", r)
	}

	for _, bad := range [][]noderuntime.Ulimit{{{Name: "files", Soft: 1, Hard: 1}}, {{Name: "nofile", Soft: 2, Hard: 1}}, {{Name: "NOFILE", Soft: 1, Hard: 1}}} {
		if _, err := (limits{memlockMax: noderuntime.Unlimited}).opts(noderuntime.WorkloadSpec{Ulimits: bad}); !errors.Is(err, ErrInvalidUlimit) {
			t.Errorf("limits.opts(%+v) = %v, want ErrInvalidUlimit", bad, err)
		}
	}
}

// testLimits runs a container with its limits and checks what it sees.
func (f *fixture) testLimits(t *testing.T) {
	t.Run("ShmAndUlimits", func(t *testing.T) {
		t.Parallel()
		f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: "limits", MemoryBytes: 256 << 20, ShmBytes: 32 << 20, MemlockUnlimited: true,
			Ulimits: []noderuntime.Ulimit{{Name: "nofile", Soft: 2048, Hard: 4096}},
			Command: []string{"sh", "-c", `grep ' /dev/shm ' /proc/mounts; echo "nofile $(ulimit -n) $(ulimit -Hn)"; echo "memlock $(ulimit -l)"`}})
		st := wait(t, f.rt, "limits")
		log, _ := finishedOutput(t, f.rt, "limits")
		memlock := "memlock unlimited"
		if f.rt.workloads.limits.memlockMax != noderuntime.Unlimited { // a host that withholds CAP_SYS_RESOURCE
			memlock = "memlock " + strconv.FormatUint(f.rt.workloads.limits.memlockMax/1024, 10)
		}
		for _, want := range []string{"size=32768k", "nofile 2048 4096", memlock} {
			if !strings.Contains(string(log), want) {
				t.Errorf("output lacks %q (exit %d):\n%s", want, st.ExitCode, log)
			}
		}
	})
	t.Run("InvalidUlimitRefusedBeforeCreate", func(t *testing.T) {
		t.Parallel()
		_, err := f.rt.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: "limits-bad", ImageReference: f.image.Reference, ManifestDigest: f.image.ManifestDigest,
			Ulimits: []noderuntime.Ulimit{{Name: "nofile", Soft: 10, Hard: 5}}})
		requireIs(t, err, ErrInvalidUlimit)
		_, err = f.rt.Inspect(testCtx(t), "limits-bad")
		requireIs(t, err, noderuntime.ErrWorkloadNotFound)
	})
}

// TestCFSBandwidth: a cap is its millicores per second, as quota per
// period; a small one gets a longer period instead of a quota its own
// start would spend (runc's init and the exec run under it).
func TestCFSBandwidth(t *testing.T) {
	for _, c := range []struct {
		millis int64
		quota  int64
		period uint64
	}{
		{4000, 400_000, 100_000},
		{500, 50_000, 100_000},
		{100, 10_000, 100_000},
		{50, 10_000, 200_000},
		{15, 10_000, 666_666},
		{10, 10_000, 1_000_000},
		{3, 3_000, 1_000_000}, // the longest period: the quota shrinks
		{1, 1_000, 1_000_000},
	} {
		q, p := cfsBandwidth(c.millis)
		if q != c.quota || p != c.period {
			t.Errorf("cfsBandwidth(%d) = %d µs per %d µs, want %d per %d", c.millis, q, p, c.quota, c.period)
		}
		if got := q * 1000 / int64(p); got != c.millis {
			t.Errorf("cfsBandwidth(%d) averages %d millicores", c.millis, got)
		}
		if q < 1000 || p > cfsMaxPeriod {
			t.Errorf("cfsBandwidth(%d) = %d per %d: outside the kernel's bounds", c.millis, q, p)
		}
	}
}
