package agent

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// datasync flushes f's data and only the metadata needed to read it back
// (fdatasync): for an overwrite inside the file, no metadata at all.
func datasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for serr = unix.Fdatasync(int(fd)); errors.Is(serr, unix.EINTR); serr = unix.Fdatasync(int(fd)) {
		}
	}); err != nil {
		// Control fails only when the descriptor is closed.
		return fmt.Errorf("%w: %w", os.ErrClosed, err)
	}
	return serr
}
