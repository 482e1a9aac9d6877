package controlplane

import (
	"context"
	"hash/maphash"
	"sync"
)

// keyedPool runs jobs on a fixed set of workers. Jobs with the same key go
// to the same worker, in the order they were submitted, so one Run's submit
// and cancel (or one node's enrollments) never overtake each other; jobs
// with different keys run concurrently.
//
// The pool's goroutines are owned by the WaitGroup passed to newKeyedPool
// and stop when ctx ends; a job still queued then is dropped (the message it
// holds is left unacked, so JetStream delivers it again).
type keyedPool[T any] struct {
	ctx   context.Context
	seed  maphash.Seed
	lanes []chan T
}

// newKeyedPool starts workers goroutines, each with a queue of depth jobs,
// that call run for every job until ctx ends.
func newKeyedPool[T any](ctx context.Context, wg *sync.WaitGroup, workers, depth int, run func(context.Context, T)) *keyedPool[T] {
	p := &keyedPool[T]{ctx: ctx, seed: maphash.MakeSeed(), lanes: make([]chan T, max(workers, 1))}
	for i := range p.lanes {
		lane := make(chan T, max(depth, 0))
		p.lanes[i] = lane
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case job := <-lane:
					if ctx.Err() != nil {
						return
					}
					run(ctx, job)
				}
			}
		})
	}
	return p
}

// submit queues job on key's worker, waiting while that worker's queue is
// full (back-pressure onto the caller). It reports false when ctx ended
// first and the job was not queued.
func (p *keyedPool[T]) submit(key string, job T) bool {
	lane := p.lanes[maphash.String(p.seed, key)%uint64(len(p.lanes))]
	select {
	case lane <- job:
		return true
	case <-p.ctx.Done():
		return false
	}
}
