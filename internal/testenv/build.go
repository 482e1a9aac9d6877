package testenv

import (
	"os/exec"
	"path"
	"path/filepath"
	"testing"
)

// BuildGPUProbe builds cmd/warmfleet-gpu-probe into a temp dir and returns
// its path, for tests that run the agent's real GPU probe.
func BuildGPUProbe(t testing.TB) string {
	return BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet-gpu-probe")
}

// BuildCommand builds the main package pkg into a temp dir and returns the
// binary's path, for tests that run a real process (and kill it). It skips
// t (fails under CI) when the go tool is missing.
func BuildCommand(t testing.TB, pkg string) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		unavailable(t, "the go tool is not on PATH: cannot build %s", pkg)
	}
	out := filepath.Join(t.TempDir(), path.Base(pkg))
	cmd := exec.Command(gobin, "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: go build %s: %v\n%s", pkg, err, b)
	}
	return out
}
