package agent

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// DefaultFactsInterval is how often an agent reports facts when
// Config.FactsInterval is unset.
const DefaultFactsInterval = 30 * time.Second

// Reports a change triggers wait factsSettle, so a burst (prepare, launch,
// exit) becomes one report, and come at most one per factsMinGap: measuring
// walks caches and lists images, which a busy node must not do per event.
const (
	factsSettle = 500 * time.Millisecond
	factsMinGap = 3 * time.Second
)

// factsMaxDefer bounds how long a measurement waits for the launches in
// flight (launchGate), so a node that never stops launching still reports.
const factsMaxDefer = 10 * time.Second

// factsLoop reports facts every interval and soon after the runtime's
// holdings change (a workload exiting among them), until ctx ends. Each
// report is preceded by a disk collection when the disk is past its high
// watermark.
func (a *Agent) factsLoop(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.factsChanged:
			wait := max(factsSettle, factsMinGap-time.Since(last))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			select { // changes during the wait are in this report
			case <-a.factsChanged:
			default:
			}
			t.Reset(every)
		}
		// Measured between launches: its runtime calls slow one they overlap.
		due := time.Now()
		if !a.launches.await(ctx, factsMaxDefer) {
			return
		}
		// A collection first, so this report carries the disk it freed.
		start := time.Now()
		a.collectDisk(ctx)
		f := a.facts(ctx)
		last = time.Now()
		a.log.Debug("facts measured", zap.Duration("took", last.Sub(start)), zap.Duration("deferred", start.Sub(due)))
		if err := a.publish(ctx, schemas.Observation{Kind: schemas.ObsFacts, Facts: &f}, ""); err != nil && ctx.Err() == nil {
			a.log.Warn("facts not published; next report follows", zap.Error(err))
		}
	}
}

// changeWatch is the runtime as the agent uses it: it signals the facts loop
// when what the node holds may have changed: an image was ensured (by a
// prepare or a launch) or a workload exited (its caches were written, its
// container goes); and it counts its launches in flight, which the facts
// loop waits for.
type changeWatch struct {
	noderuntime.Runtime
	changed  chan<- struct{} // capacity 1: a pending signal covers any number of changes
	launches *launchGate     // set on the agent's runtime; a value that only signals has none
}

func (r changeWatch) signal() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r changeWatch) EnsureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	res, err := r.Runtime.EnsureImage(ctx, spec)
	if err == nil {
		r.signal()
	}
	return res, err
}

func (r changeWatch) Wait(ctx context.Context, id string) (noderuntime.WorkloadStatus, error) {
	st, err := r.Runtime.Wait(ctx, id)
	if err == nil && st.State == noderuntime.WorkloadExited {
		r.signal()
	}
	return st, err
}

func (r changeWatch) Launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	defer r.launches.begin()()
	return r.Runtime.Launch(ctx, spec)
}

// launchGate counts the launches in flight, so facts are measured between
// them: a measurement's image inventory (content and snapshot reads for
// every image) goes to the daemon a launch waits on, and slowed the
// launches it overlapped by 50–150 ms in the e2e bench. Without it, the
// report an image ensure triggers factsSettle later lands on the launch
// that follows the ensure whenever that launch takes longer than the settle.
type launchGate struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed while no launch is in flight
}

func newLaunchGate() *launchGate {
	idle := make(chan struct{})
	close(idle)
	return &launchGate{idle: idle}
}

// begin marks a launch in flight until the returned end is called.
func (g *launchGate) begin() (end func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		g.idle = make(chan struct{})
	}
	g.n++
	return sync.OnceFunc(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.n--; g.n == 0 {
			close(g.idle)
		}
	})
}

// await returns once no launch is in flight, or after limit; false when ctx
// ended first.
func (g *launchGate) await(ctx context.Context, limit time.Duration) bool {
	g.mu.Lock()
	idle := g.idle
	g.mu.Unlock()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}
