package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// benchCapacity is what a node on the no-op runtime offers: more than any
// bench asks of it.
var benchCapacity = schemas.Resources{CPUMillis: 64_000, MemoryBytes: 256 << 30}

// startNoopAgent runs a real agent over the no-op runtime and waits until
// the control plane's registry holds its session.
func startNoopAgent(e *env, nodeID string, ro noopruntime.Options) (*agent.Agent, func(), error) {
	return startAgent(e, agent.Config{NodeID: nodeID, Generation: 1, DataDir: filepath.Join(e.dir, "agent-"+nodeID),
		Capacity: benchCapacity}, noopruntime.New(ro), nil)
}

// startAgent runs a real agent with cfg on rt (closeRT, when given, closes
// rt after the agent stops) and waits until the control plane's registry
// holds its session.
func startAgent(e *env, cfg agent.Config, rt noderuntime.Runtime, closeRT func()) (*agent.Agent, func(), error) {
	conn, err := e.connect("agent-" + cfg.NodeID)
	if err != nil {
		return nil, nil, err
	}
	a, err := agent.New(cfg, conn, rt, e.log.Named(cfg.NodeID))
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stop := func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
		}
		if closeRT != nil {
			closeRT()
		}
	}
	if err := waitEnrolled(ctx, conn, cfg.NodeID, a, done); err != nil {
		stop()
		return nil, nil, err
	}
	return a, stop, nil
}

// waitEnrolled waits until wf_nodes holds node nodeID's current session (a's), for
// at most 30 s or until the agent stops (done).
func waitEnrolled(ctx context.Context, conn *bus.Conn, nodeID string, a *agent.Agent, done <-chan error) error {
	kv, err := conn.JS.KeyValue(ctx, bus.BucketNodes)
	if err != nil {
		return err
	}
	return poll(ctx, 20*time.Millisecond, time.Now().Add(30*time.Second), func() (bool, error) {
		var rec schemas.NodeRecord
		if _, err := bus.GetJSON(ctx, kv, nodeID, &rec); err == nil && rec.FencingToken != 0 && rec.FencingToken == a.Enrollment().FencingToken {
			return true, nil
		}
		select {
		case err := <-done:
			return false, fmt.Errorf("agent stopped: %w", err)
		default:
			return false, nil
		}
	}, func() error { return errors.New("agent did not enroll in 30s") })
}

// startContainerdAgent runs a real agent on the containerd runtime and waits
// until the registry holds its session, in containerd namespace ns (the
// daemon's Namespace when empty; another must be one startContainerd was
// given). cfg's NodeID is required; its DataDir, ContentRoot, StopGrace and
// Generation are filled in when unset. wrap, when given, wraps the runtime
// the agent sees.
func startContainerdAgent(e *env, cd *benchContainerd, imgDir, ns string, cfg agent.Config, wrap func(noderuntime.Runtime) noderuntime.Runtime) (*agent.Agent, func(), error) {
	if cfg.DataDir == "" {
		cfg.DataDir = filepath.Join(e.dir, "agent-"+cfg.NodeID)
	}
	if cfg.ContentRoot == "" {
		cfg.ContentRoot = cd.Root
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = 2 * time.Second
	}
	if cfg.Generation == 0 {
		cfg.Generation = 1
	}
	if ns == "" {
		ns = cd.Namespace
	}
	rt, err := containerd.New(context.Background(), containerd.Options{Address: cd.Address, Namespace: ns, ImageDir: imgDir,
		LogDir: filepath.Join(cfg.DataDir, "logs"), StateDir: filepath.Join(cfg.DataDir, "runtime"), Logger: e.log.Named("containerd")})
	if err != nil {
		return nil, nil, err
	}
	var seen noderuntime.Runtime = rt
	if wrap != nil {
		seen = wrap(rt)
	}
	return startAgent(e, cfg, seen, func() { removeLeft(rt, e.log); _ = rt.Close() })
}

// removeLeft removes the workloads a stopped agent had not removed yet (the
// last Run's, whose removal follows its exit report), so no namespace,
// veth, address lease or masquerade rule of the bench outlives it.
func removeLeft(rt *containerd.Runtime, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	left, err := rt.List(ctx)
	if err != nil {
		log.Warn("list workloads left by the agent", zap.Error(err))
		return
	}
	for _, st := range left {
		if err := rt.Remove(ctx, st.ID); err != nil {
			log.Warn("remove a workload left by the agent", zap.String("workload", st.ID), zap.Error(err))
		}
	}
}
