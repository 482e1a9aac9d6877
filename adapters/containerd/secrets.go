package containerd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// secretFiles keeps each workload's secret files in a tmpfs of its own,
// <dir>/<id>, mounted 0700 nosuid,nodev,noexec and no larger than one
// delivery: the values are in memory only, and the directory goes with
// the workload (release). Each file is bind-mounted read-only into the
// container at its path.
type secretFiles struct {
	dir string
	log *zap.Logger
}

// secretTmpfsBytes sizes one workload's tmpfs: every value of one
// delivery, and a page per file beside.
const secretTmpfsBytes = schemas.MaxSecretValuesBytes + (schemas.MaxSecretRefs+1)*4096

// dirOf is where workload id's secret files are.
func (s secretFiles) dirOf(id string) string { return filepath.Join(s.dir, id) }

// write mounts id's tmpfs and writes its files into it, returning the
// spec options that bind-mount them into the container and give them to
// its process's user. Nothing is written when spec has no secret files.
// On error what was made is left for release.
func (s secretFiles) write(spec noderuntime.WorkloadSpec) (oci.SpecOpts, error) {
	if len(spec.SecretFiles) == 0 {
		return nil, nil
	}
	dir := s.dirOf(spec.ID)
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("secret files: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("secret files: %w", err)
	}
	opts := "mode=0700,size=" + strconv.Itoa(secretTmpfsBytes) + ",nr_inodes=" + strconv.Itoa(schemas.MaxSecretRefs+8)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return nil, fmt.Errorf("secret files: mount a tmpfs at %s: %w", dir, err)
	}
	mounts := make([]specs.Mount, 0, len(spec.SecretFiles))
	paths := make([]string, 0, len(spec.SecretFiles))
	for i, f := range spec.SecretFiles {
		host := filepath.Join(dir, strconv.Itoa(i))
		if err := writeSecretFile(host, f); err != nil {
			// The error names the file's place, never its contents.
			return nil, fmt.Errorf("secret files: write %s: %w", f.Path, err)
		}
		paths = append(paths, host)
		mounts = append(mounts, specs.Mount{Destination: f.Path, Type: "bind", Source: host,
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	return withSecretMounts(mounts, paths), nil
}

// writeSecretFile writes one file with its mode, whatever the umask.
func writeSecretFile(path string, f schemas.SecretFileValue) error {
	fd, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, werr := fd.Write(f.Value)
	cerr := fd.Close()
	if err := errors.Join(werr, cerr); err != nil {
		return err
	}
	return os.Chmod(path, fs.FileMode(f.Mode&0o777))
}

// withSecretMounts adds the bind mounts and makes the files their
// process's user's (the image's, known once its config is applied), so a
// mode of 0400 reads for a workload that does not run as root.
func withSecretMounts(mounts []specs.Mount, paths []string) oci.SpecOpts {
	return func(ctx context.Context, c oci.Client, ctr *containers.Container, s *oci.Spec) error {
		uid, gid := 0, 0
		if s.Process != nil {
			uid, gid = int(s.Process.User.UID), int(s.Process.User.GID)
		}
		for _, p := range paths {
			if err := os.Chown(p, uid, gid); err != nil {
				return fmt.Errorf("secret files: give to %d:%d: %w", uid, gid, err)
			}
		}
		return oci.WithMounts(mounts)(ctx, c, ctr, s)
	}
}

// release unmounts id's tmpfs, which takes its files with it, and removes
// its directory. Nothing there is no error.
func (s secretFiles) release(id string) error {
	dir := s.dirOf(id)
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("secret files of %s: unmount: %w", id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("secret files of %s: %w", id, err)
	}
	return nil
}

// sweep releases the secret files of every workload exists says is gone
// or done (a predecessor died before it released them).
func (s secretFiles) sweep(ctx context.Context, live func(context.Context, string) (bool, error)) error {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("secret files: %w", err)
	}
	var errs []error
	for _, e := range entries {
		keep, err := live(ctx, e.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if keep {
			continue
		}
		if err := s.release(e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		s.log.Info("removed secret files left by an earlier run", zap.String("workload", e.Name()))
	}
	return errors.Join(errs...)
}

// secretEnv is the spec's secret variables as KEY=VALUE, for the process's
// environment only.
func secretEnv(spec noderuntime.WorkloadSpec) []string {
	env := make([]string, len(spec.SecretEnv))
	for i, e := range spec.SecretEnv {
		env[i] = e.Name + "=" + string(e.Value)
	}
	return env
}
