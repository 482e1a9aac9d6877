package e2e

import (
	"context"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// counts tallies the effects a node's runtime really performed.
type counts struct {
	mu       sync.Mutex
	launches map[string]int // workload id → successful launches
	pulls    int            // EnsureImage calls that fetched or imported bytes
	stops    map[string]int
}

func (c *counts) launched(id string) int { c.mu.Lock(); defer c.mu.Unlock(); return c.launches[id] }
func (c *counts) stopped(id string) int  { c.mu.Lock(); defer c.mu.Unlock(); return c.stops[id] }
func (c *counts) pulled() int            { c.mu.Lock(); defer c.mu.Unlock(); return c.pulls }

// countingRuntime is the real containerd runtime with a tally of effects.
type countingRuntime struct {
	noderuntime.Runtime
	c *counts
}

func (r *countingRuntime) EnsureImage(ctx context.Context, s noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	res, err := r.Runtime.EnsureImage(ctx, s)
	if err == nil && !res.AlreadyPresent {
		r.c.mu.Lock()
		r.c.pulls++
		r.c.mu.Unlock()
	}
	return res, err
}

func (r *countingRuntime) Launch(ctx context.Context, s noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	st, err := r.Runtime.Launch(ctx, s)
	if err == nil {
		r.c.mu.Lock()
		if r.c.launches == nil {
			r.c.launches = map[string]int{}
		}
		r.c.launches[s.ID]++
		r.c.mu.Unlock()
	}
	return st, err
}

func (r *countingRuntime) Stop(ctx context.Context, id string, grace time.Duration) error {
	r.c.mu.Lock()
	if r.c.stops == nil {
		r.c.stops = map[string]int{}
	}
	r.c.stops[id]++
	r.c.mu.Unlock()
	return r.Runtime.Stop(ctx, id, grace)
}
