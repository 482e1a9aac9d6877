package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// RestoreStats says what a restore wrote and fetched.
type RestoreStats struct {
	Files, Dirs, Symlinks int
	// Bytes are the file bytes written; BytesFetched the chunks read, as
	// stored.
	Bytes, BytesFetched int64
	Chunks              int
}

// Restore replaces the workspace at dst with checkpoint id. Everything is
// written into a staging directory beside dst, every chunk checked against
// its digest and size; only a whole restore takes dst's place (an atomic
// exchange where the kernel has one), so a failed one leaves dst as it was
// and nothing half-restored behind. Owners are restored when running as
// root. workers fetch that many chunks at once (0: DefaultWorkers).
func Restore(ctx context.Context, store Store, id ID, dst string, workers int) (Manifest, RestoreStats, error) {
	var st RestoreStats
	c, err := newCodec()
	if err != nil {
		return Manifest{}, st, err
	}
	defer c.close()
	m, _, err := load(ctx, store, c, id)
	if err != nil {
		return Manifest{}, st, err
	}
	parent := filepath.Dir(dst)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return Manifest{}, st, fmt.Errorf("checkpoint: restore into %s: %w", dst, err)
	}
	staging, err := os.MkdirTemp(parent, "."+filepath.Base(dst)+".restore-")
	if err != nil {
		return Manifest{}, st, fmt.Errorf("checkpoint: restore into %s: %w", dst, err)
	}
	err = restoreInto(ctx, store, c, &m, staging, max(workers, 0), &st)
	if err == nil {
		err = swap(staging, dst)
	}
	if rmErr := os.RemoveAll(staging); err == nil && rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
		err = fmt.Errorf("checkpoint: remove the old workspace: %w", rmErr)
	}
	if err != nil {
		return Manifest{}, st, err
	}
	return m, st, nil
}

func restoreInto(ctx context.Context, store Store, c *codec, m *Manifest, dir string, workers int, st *RestoreStats) error {
	for _, e := range m.Entries {
		if err := create(dir, &e); err != nil {
			return err
		}
		switch e.Kind {
		case KindDir:
			st.Dirs++
		case KindFile:
			st.Files++
			st.Bytes += e.Size
		case KindSymlink:
			st.Symlinks++
		}
	}
	if err := fetchChunks(ctx, store, c, m, dir, workers, st); err != nil {
		return err
	}
	root := os.Geteuid() == 0
	for i := len(m.Entries) - 1; i >= 0; i-- {
		if err := finish(dir, &m.Entries[i], root); err != nil {
			return err
		}
	}
	return nil
}

// create makes e's directory, symlink or empty file. Its parent
// is a directory this restore made (Manifest.Validate), so nothing is
// written through a symlink.
func create(dir string, e *Entry) error {
	p := filepath.Join(dir, filepath.FromSlash(e.Path))
	var err error
	switch e.Kind {
	case KindDir:
		err = os.Mkdir(p, 0o700)
	case KindSymlink:
		err = os.Symlink(e.Target, p)
	case KindFile:
		var f *os.File
		if f, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("checkpoint: restore %s: %w", e.Path, err)
	}
	return nil
}

// finish gives e its owner (as root), mode and mtime.
func finish(dir string, e *Entry, root bool) error {
	p := filepath.Join(dir, filepath.FromSlash(e.Path))
	var err error
	if root {
		err = os.Lchown(p, int(e.UID), int(e.GID))
	}
	if err == nil && e.Kind != KindSymlink {
		mode := os.FileMode(e.Mode & 0o777)
		if e.Mode&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		err = os.Chmod(p, mode)
	}
	if err == nil {
		ts := []unix.Timespec{unix.NsecToTimespec(e.MTimeNanos), unix.NsecToTimespec(e.MTimeNanos)}
		err = unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return fmt.Errorf("checkpoint: restore %s: %w", e.Path, err)
	}
	return nil
}

// swap puts staging in dst's place; what was at dst ends at staging.
func swap(staging, dst string) error {
	err := unix.Renameat2(unix.AT_FDCWD, staging, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOENT):
		if _, statErr := os.Lstat(dst); errors.Is(statErr, os.ErrNotExist) {
			return os.Rename(staging, dst)
		}
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
		// No exchange here: move the old one aside, then the new in.
		old := staging + ".old"
		if err := os.Rename(dst, old); err != nil {
			return fmt.Errorf("checkpoint: swap in %s: %w", dst, err)
		}
		if err := os.Rename(staging, dst); err != nil {
			return errors.Join(fmt.Errorf("checkpoint: swap in %s: %w", dst, err), os.Rename(old, dst))
		}
		return os.Rename(old, staging)
	}
	return fmt.Errorf("checkpoint: swap in %s: %w", dst, err)
}
