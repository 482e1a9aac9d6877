package shadeformtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Boot runs an instance's startup script the way the machine would, with
// bash, but with WARMFLEET_ROOT pointing at a fresh directory under dir so
// nothing outside it is touched, and returns that root. It fails when the
// instance has no script or bash is missing.
func (s *Server) Boot(id, dir string) (string, error) {
	in, ok := s.Instance(id)
	if !ok {
		return "", fmt.Errorf("no instance %s", id)
	}
	if len(in.Script) == 0 {
		return "", fmt.Errorf("instance %s was given no startup script", id)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		return "", err
	}
	root, err := os.MkdirTemp(dir, "machine-")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bash, "-s")
	cmd.Env = append(os.Environ(), "WARMFLEET_ROOT="+root)
	cmd.Stdin = bytes.NewReader(in.Script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("startup script of %s: %w: %s", id, err, out)
	}
	return root, nil
}

// Received boots the instance's script and returns the bootstrap file it
// wrote: what the machine received.
func (s *Server) Received(id, dir string) ([]byte, error) {
	root, err := s.Boot(id, dir)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(root, "etc", "warmfleet", "bootstrap.json"))
}
