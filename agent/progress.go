package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

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

// runProgress reports an attempt's transfer as preparing observations of
// its workload: of its image, or of the named artifact.
func (r *reporter) runProgress(runID, attemptID, artifact string) func(context.Context, schemas.TransferProgress) {
	return func(ctx context.Context, p schemas.TransferProgress) {
		p.Artifact = artifact
		r.workload(ctx, schemas.WorkloadObservation{RunID: runID, AttemptID: attemptID, Phase: schemas.WorkloadPreparing, Progress: &p})
	}
}

// prefetchProgress reports a prefetch's transfer as ImageProgress
// observations; a lost one is replaced by the next.
func (r *reporter) prefetchProgress(opID string, p *schemas.PrepareImage) func(context.Context, schemas.TransferProgress) {
	return func(ctx context.Context, tp schemas.TransferProgress) {
		o := schemas.Observation{Kind: schemas.ObsImageProgress, ImageProgress: &schemas.ImageProgress{
			OperationID: opID, PrefetchID: p.PrefetchID, ManifestDigest: p.ManifestDigest, Progress: tp, ObservedAt: r.now()}}
		if err := r.publish(ctx, o, ""); err != nil && ctx.Err() == nil {
			r.log.Debug("prefetch progress not published", zap.String("op", opID), zap.Error(err))
		}
	}
}

// trackProgress returns the callback to hand EnsureImage for one transfer,
// and the function that stops reporting. send reports the counts every
// interval while they move; none is sent for a transfer that ends within
// the first interval. The reporting goroutine runs in wg.
func trackProgress(ctx context.Context, wg *sync.WaitGroup, every time.Duration, send func(context.Context, schemas.TransferProgress)) (func(done, total int64), func()) {
	p := &transferProgress{}
	ctx, cancel := context.WithCancel(ctx)
	finished := make(chan struct{})
	wg.Go(func() {
		defer close(finished)
		t := time.NewTicker(every)
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
			send(ctx, schemas.TransferProgress{DoneBytes: done, TotalBytes: total})
		}
	})
	return p.set, func() { cancel(); <-finished }
}
