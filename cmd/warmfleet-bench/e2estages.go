package main

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// span is one runtime call's start and end.
type span struct{ start, end time.Time }

// timedRuntime records when the agent's EnsureImage and Launch calls
// start and end, so a Run's preparing stage splits into the artifact fetch
// (which the attempt's queue applies first) and the image pull; and when
// its Images calls do, the image inventory of each facts measurement, so a
// launch one overlapped is counted.
type timedRuntime struct {
	noderuntime.Runtime
	mu                             sync.Mutex
	ensures, launches, inventories []span
}

func (t *timedRuntime) EnsureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	s := time.Now()
	res, err := t.Runtime.EnsureImage(ctx, spec)
	t.record(&t.ensures, s)
	return res, err
}

func (t *timedRuntime) Launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	s := time.Now()
	st, err := t.Runtime.Launch(ctx, spec)
	t.record(&t.launches, s)
	return st, err
}

func (t *timedRuntime) Images(ctx context.Context) ([]schemas.ImageLocality, error) {
	s := time.Now()
	imgs, err := t.Runtime.Images(ctx)
	t.record(&t.inventories, s)
	return imgs, err
}

// inventoryDuring reports whether an image inventory overlapped l.
func (t *timedRuntime) inventoryDuring(l span) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.ContainsFunc(t.inventories, func(s span) bool { return s.start.Before(l.end) && l.start.Before(s.end) })
}

func (t *timedRuntime) record(to *[]span, start time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	*to = append(*to, span{start, time.Now()})
	if len(*to) > 64 {
		*to = (*to)[len(*to)-64:]
	}
}

// since is the first EnsureImage and the last Launch that started at or
// after t0.
func (t *timedRuntime) since(t0 time.Time) (ensure, launch span, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.ensures {
		if !s.start.Before(t0) {
			ensure, ok = s, true
			break
		}
	}
	found := false
	for _, s := range t.launches {
		if !s.start.Before(t0) {
			launch, found = s, true
		}
	}
	return ensure, launch, ok && found
}

// sizedStages are a Run's stages, in order; all on this process's clock
// (the control plane runs in it).
var sizedStages = []string{"queue (submit→accepted)", "decision (accepted→placed)", "dispatch (placed→preparing)",
	"artifact (preparing→image ensure)", "image pull + unpack", "ensure→launch", "launch (containerd create + start)", "report (→running seen)"}

type sizedCase struct {
	total  []time.Duration
	floor  []time.Duration
	raw    []time.Duration // the floor's transfer part
	direct []time.Duration // the floor's unpack + start part
	stages map[string][]time.Duration
	// factsDuring counts the Runs whose launch a facts measurement overlapped.
	factsDuring int
}

func newSizedCase() *sizedCase { return &sizedCase{stages: map[string][]time.Duration{}} }

func (c *sizedCase) addRun(end runEnd, ensure, launch span) {
	running := end.seen[schemas.PhaseRunning]
	c.total = append(c.total, running.Sub(end.submitted))
	marks := []time.Time{end.submitted, end.accepted, end.phases[schemas.PhasePlaced], end.phases[schemas.PhasePreparing],
		ensure.start, ensure.end, launch.start, launch.end, running}
	for i, name := range sizedStages {
		if !marks[i].IsZero() && !marks[i+1].IsZero() {
			c.stages[name] = append(c.stages[name], marks[i+1].Sub(marks[i]))
		}
	}
}

// pairedRatio is the median of each Run's time over the floor measured
// beside it (the i-th of each): on a shared machine load comes in bursts,
// and a pair sees the same burst where two medians need not.
func (c *sizedCase) pairedRatio() float64 {
	n := min(len(c.total), len(c.floor))
	r := make([]float64, 0, n)
	for i := range n {
		if c.floor[i] > 0 {
			r = append(r, float64(c.total[i])/float64(c.floor[i]))
		}
	}
	return median(r)
}
