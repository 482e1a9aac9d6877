package testenv

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildGPUProbe builds cmd/warmfleet-gpu-probe into a temp dir and returns
// its path, for tests that run the agent's real GPU probe. It skips t (fails
// under CI) when the go tool is missing.
func BuildGPUProbe(t testing.TB) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		unavailable(t, "the go tool is not on PATH: cannot build the GPU probe")
	}
	out := filepath.Join(t.TempDir(), "warmfleet-gpu-probe")
	cmd := exec.Command(gobin, "build", "-o", out, "github.com/warmfleet/warmfleet/cmd/warmfleet-gpu-probe")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: go build the GPU probe: %v\n%s", err, b)
	}
	return out
}
