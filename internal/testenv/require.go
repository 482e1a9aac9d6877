// Package testenv gives tests of every package real dependencies to run
// against, such as a private containerd daemon and a small OCI image built
// from the host's static busybox. It is ordinary (non-_test) code so any
// package's tests can import it.
//
// A dependency that is missing skips the test with a hint how to install it,
// except when the CI environment variable is set: CI must never skip silently,
// so there the test fails instead.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// unavailable skips t, or fails it when running under CI.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set, refusing to skip: "+format, args...)
	}
	t.Skipf(format, args...)
}

// requireBinaries checks that every named program is on PATH.
func requireBinaries(t testing.TB, hint string, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			unavailable(t, "%s not found on PATH (%s)", n, hint)
		}
	}
}

// requireRoot checks for the privileges a container runtime needs.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		unavailable(t, "containerd needs root; running as uid %d", os.Geteuid())
	}
}
