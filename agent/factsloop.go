package agent

import (
	"context"
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
		a.disk.Collect(ctx, a.askKeep)
		f := a.meter.facts(ctx)
		last = time.Now()
		a.log.Debug("facts measured", zap.Duration("took", last.Sub(start)), zap.Duration("deferred", start.Sub(due)))
		if err := a.rep.publish(ctx, schemas.Observation{Kind: schemas.ObsFacts, Facts: &f}, ""); err != nil && ctx.Err() == nil {
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
	launches *launchGate     // the launches in flight, which the facts loop waits for
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
