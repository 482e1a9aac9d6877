package agent

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// DefaultProgressInterval is how often a node reports an image transfer
// still under way.
const DefaultProgressInterval = time.Second

// transferProgress holds the latest counts a runtime reported. The runtime
// may call in from its own goroutines and many times a second; only a
// ticker publishes, so a fast transfer costs no extra messages.
type transferProgress struct {
	done, total atomic.Int64
}

func (p *transferProgress) set(done, total int64) {
	p.done.Store(done)
	p.total.Store(total)
}

// trackProgress returns the callback to hand EnsureImage for one attempt, and
// the function that stops reporting. Reports go out as preparing
// observations every interval while the counts move; none is sent for a
// transfer that ends within the first interval.
func (a *Agent) trackProgress(ctx context.Context, runID, attemptID string) (func(done, total int64), func()) {
	p := &transferProgress{}
	ctx, cancel := context.WithCancel(ctx)
	finished := make(chan struct{})
	a.wg.Go(func() {
		defer close(finished)
		t := time.NewTicker(a.cfg.ProgressInterval)
		defer t.Stop()
		var sent int64 = -1
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			done, total := p.done.Load(), p.total.Load()
			if done == 0 || done == sent || (total > 0 && done > total) {
				continue
			}
			sent = done
			a.report(ctx, schemas.WorkloadObservation{RunID: runID, AttemptID: attemptID, Phase: schemas.WorkloadPreparing,
				Progress: &schemas.TransferProgress{DoneBytes: done, TotalBytes: total}})
		}
	})
	return p.set, func() { cancel(); <-finished }
}
