//go:build !linux

package agent

import "os"

// datasync flushes f; without fdatasync, with its metadata too.
func datasync(f *os.File) error { return f.Sync() }
