package containerd

import (
	"context"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/oci"
)

// capabilities are the only capabilities a workload's process holds
// (bounding, effective and permitted sets), host-network Runs included:
// what common images need to change owners and modes of their own files,
// switch users, bind ports below 1024 and chroot. Left out of the usual
// container set: CAP_NET_RAW (raw and packet sockets read and forge any
// traffic the Run's network reaches, on a host-network Run the node's own
// NATS session), CAP_MKNOD (devices come from the spec, never from the
// Run) and CAP_AUDIT_WRITE (nothing in a Run writes the host's audit log).
// CAP_SYS_ADMIN and every other capability were never given.
func capabilities() []string {
	return []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
		"CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_SETFCAP",
	}
}

// confinement are the spec options that bound what a workload's process
// may do: capabilities, no-new-privileges (a setuid binary or a file
// capability cannot give more), and containerd's default seccomp profile.
// They come last: the profile allows syscalls by the capabilities the spec
// holds, so it is built from the final set, after the CDI edits (which add
// devices, mounts and hooks, never capabilities).
func confinement() []oci.SpecOpts {
	return []oci.SpecOpts{
		oci.WithCapabilities(capabilities()),
		withNoAmbient,
		oci.WithNoNewPrivileges,
		seccomp.WithDefaultProfile(),
	}
}

// withNoAmbient empties the ambient and inheritable sets: a capability
// outside capabilities cannot come back across an exec.
func withNoAmbient(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Process != nil && s.Process.Capabilities != nil {
		s.Process.Capabilities.Ambient = nil
		s.Process.Capabilities.Inheritable = nil
	}
	return nil
}
