package containerd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// ErrInvalidMount reports a WorkloadSpec mount this adapter refuses: a
// relative path, a target of "/", or a source that is not a directory (or a
// regular file mounted read-only: an artifact replica).
var ErrInvalidMount = errors.New("invalid mount")

// bindMounts turns a workload's mounts into OCI bind mounts. rbind carries
// mounts below the source along; ro is applied by runc as a read-only
// remount, so a read-only cache cannot be written from inside.
func bindMounts(ms []noderuntime.Mount) (oci.SpecOpts, error) {
	out := make([]specs.Mount, 0, len(ms))
	seen := make(map[string]bool, len(ms))
	for _, m := range ms {
		if err := checkMount(m); err != nil {
			return nil, err
		}
		target := filepath.Clean(m.Target)
		if seen[target] {
			return nil, fmt.Errorf("%w: two mounts at %s", ErrInvalidMount, target)
		}
		seen[target] = true
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		out = append(out, specs.Mount{Destination: target, Type: "bind", Source: filepath.Clean(m.Source), Options: []string{"rbind", mode}})
	}
	return oci.WithMounts(out), nil
}

func checkMount(m noderuntime.Mount) error {
	switch {
	case !filepath.IsAbs(m.Source):
		return fmt.Errorf("%w: source %q is not an absolute path", ErrInvalidMount, m.Source)
	case !filepath.IsAbs(m.Target) || filepath.Clean(m.Target) == "/":
		return fmt.Errorf("%w: target %q is not an absolute path below /", ErrInvalidMount, m.Target)
	}
	st, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("%w: source %s: %w", ErrInvalidMount, m.Source, err)
	}
	if !st.IsDir() && !(st.Mode().IsRegular() && m.ReadOnly) {
		return fmt.Errorf("%w: source %s is neither a directory nor a regular file mounted read-only", ErrInvalidMount, m.Source)
	}
	return nil
}
