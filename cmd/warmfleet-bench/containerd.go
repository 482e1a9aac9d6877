package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/internal/ctrdproc"
)

// benchContainerd is a private containerd daemon the e2e bench starts, as
// the local provider and internal/testenv do: its own root, state and
// socket under one temp dir, removed with it.
type benchContainerd struct {
	*ctrdproc.Daemon
	// Namespace is the agent's; the direct baseline uses Namespace-direct.
	Namespace string
}

// startContainerd starts the daemon; its namespaces are Namespace,
// Namespace-direct and Namespace-<x> for each extra x.
func startContainerd(extra ...string) (*benchContainerd, error) {
	if err := ctrdproc.Check(); err != nil {
		return nil, fmt.Errorf("containerd: %w", err)
	}
	dir, err := os.MkdirTemp("/tmp", "wfbc")
	if err != nil {
		return nil, err
	}
	ns := filepath.Base(dir)
	nss := []string{ns, ns + "-direct"}
	for _, x := range extra {
		nss = append(nss, ns+"-"+x)
	}
	d, err := ctrdproc.Start(context.Background(), ctrdproc.Config{Dir: dir, Namespaces: nss, Log: zap.NewNop()})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &benchContainerd{Daemon: d, Namespace: ns}, nil
}

// stop ends the daemon, its tasks and shims, and removes its dir.
func (c *benchContainerd) stop() {
	if err := c.Daemon.Stop(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "warmfleet-bench:", err)
	}
	_ = os.RemoveAll(c.Dir)
}
