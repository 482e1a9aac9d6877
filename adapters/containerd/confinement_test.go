package containerd

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// testConfinement: a workload's spec, isolated or in the host's network,
// holds only the kept capabilities, no-new-privileges and a seccomp
// profile, and its process runs with exactly that (its /proc status).
func (f *fixture) testConfinement(t *testing.T) {
	for _, mode := range []noderuntime.NetworkMode{noderuntime.NetworkNone, noderuntime.NetworkHost} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			id := "confined-" + string(mode)
			f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: id, Network: mode,
				Command: []string{"grep", "-E", "^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):", "/proc/self/status"}})
			st := wait(t, f.rt, id)
			log, _ := finishedOutput(t, f.rt, id)
			if st.ExitCode != 0 {
				t.Fatalf("exit %d:\n%s", st.ExitCode, log)
			}
			requireConfinedSpec(t, f, id)
			requireConfinedProcess(t, string(log))
		})
	}
}

// requireConfinedSpec checks the container's stored OCI spec.
func requireConfinedSpec(t *testing.T, f *fixture, id string) {
	t.Helper()
	ctx := f.rt.ctx(testCtx(t))
	c, err := f.rt.client.LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	caps := s.Process.Capabilities
	for name, set := range map[string][]string{"bounding": caps.Bounding, "effective": caps.Effective, "permitted": caps.Permitted} {
		if !slices.Equal(slices.Sorted(slices.Values(set)), slices.Sorted(slices.Values(capabilities()))) {
			t.Errorf("%s capabilities %v, want %v", name, set, capabilities())
		}
		for _, never := range []string{"CAP_NET_RAW", "CAP_SYS_ADMIN", "CAP_MKNOD", "CAP_AUDIT_WRITE"} {
			if slices.Contains(set, never) {
				t.Errorf("%s capabilities hold %s", name, never)
			}
		}
	}
	if len(caps.Ambient) > 0 || len(caps.Inheritable) > 0 {
		t.Errorf("ambient %v, inheritable %v, want none", caps.Ambient, caps.Inheritable)
	}
	if !s.Process.NoNewPrivileges {
		t.Error("no-new-privileges is off")
	}
	if sc := s.Linux.Seccomp; sc == nil || sc.DefaultAction == "" || len(sc.Syscalls) == 0 {
		t.Errorf("seccomp profile %+v, want containerd's default", sc)
	}
}

// requireConfinedProcess checks the workload's own view, in the lines of
// its /proc/self/status: no raw sockets, no admin, filtered syscalls.
func requireConfinedProcess(t *testing.T, status string) {
	t.Helper()
	fields := map[string]string{}
	for line := range strings.Lines(status) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	if fields["NoNewPrivs"] != "1" || fields["Seccomp"] != "2" {
		t.Errorf("NoNewPrivs %q, Seccomp %q, want 1 and 2 (filter):\n%s", fields["NoNewPrivs"], fields["Seccomp"], status)
	}
	for _, set := range []string{"CapPrm", "CapEff", "CapBnd"} {
		mask, err := strconv.ParseUint(fields[set], 16, 64)
		if err != nil {
			t.Fatalf("%s %q: %v\n%s", set, fields[set], err, status)
		}
		for _, c := range []uint{unix.CAP_NET_RAW, unix.CAP_SYS_ADMIN, unix.CAP_MKNOD, unix.CAP_AUDIT_WRITE} {
			if mask&(1<<c) != 0 {
				t.Errorf("%s %s holds capability %d", set, fields[set], c)
			}
		}
		for _, c := range []uint{unix.CAP_CHOWN, unix.CAP_SETUID, unix.CAP_NET_BIND_SERVICE} {
			if mask&(1<<c) == 0 {
				t.Errorf("%s %s lacks capability %d", set, fields[set], c)
			}
		}
	}
	for _, set := range []string{"CapInh", "CapAmb"} {
		if mask, err := strconv.ParseUint(fields[set], 16, 64); err != nil || mask != 0 {
			t.Errorf("%s %q, want 0", set, fields[set])
		}
	}
}
