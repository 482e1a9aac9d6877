package keyed

import (
	"context"
	"sync"
)

// PoolOptions bounds a Pool. The zero value bounds nothing.
type PoolOptions struct {
	// Workers is how many jobs run at once, over all keys. Zero: no limit,
	// every key with work runs.
	Workers int
	// Queue is how many jobs may wait, over all keys and not counting
	// those running, before Submit waits for room (back-pressure onto the
	// caller). Zero: Submit never waits, and what bounds the queues is the
	// caller's (a consumer's MaxAckPending, say).
	Queue int
}

// Pool runs jobs by key: the jobs of one key one at a time, in the order
// they were submitted; jobs of different keys concurrently, up to Workers
// at once. A key with work has a goroutine of its own that exits, under the
// same lock Submit takes, when it finds the key's queue empty; so a slow
// job holds up only its own key, and a job is never left queued with no
// goroutine to run it.
//
// The pool stops when the context given to NewPool ends: jobs still queued
// are dropped (a job holding a message leaves it unacked, to be delivered
// again) and Submit refuses new ones.
type Pool[T any] struct {
	ctx   context.Context
	run   func(context.Context, T)
	slots chan struct{} // one token per running job; nil: no limit
	limit int           // PoolOptions.Queue

	mu      sync.Mutex
	queues  map[string][]T // jobs not yet started; a key is present while its goroutine runs
	queued  int            // jobs in queues
	waiting int            // Submit calls waiting for room
	room    chan struct{}  // closed (and replaced) when a job leaves a queue while some wait
	closed  bool           // ctx ended: no goroutine starts after this
	keys    sync.WaitGroup // the keys' goroutines
}

// NewPool returns a pool that calls run for each job until ctx ends. Its
// goroutines are counted in wg: wg.Wait returns after ctx ends and every job
// in hand has returned.
func NewPool[T any](ctx context.Context, wg *sync.WaitGroup, o PoolOptions, run func(context.Context, T)) *Pool[T] {
	p := &Pool[T]{ctx: ctx, run: run, limit: max(o.Queue, 0), queues: map[string][]T{}, room: make(chan struct{})}
	if o.Workers > 0 {
		p.slots = make(chan struct{}, o.Workers)
	}
	// The keys' goroutines start and stop with the traffic, so they are
	// counted in the pool's own WaitGroup, whose Add never meets its Wait:
	// both are ordered by closed under mu. wg sees one goroutine for the
	// pool's whole life.
	wg.Go(func() {
		<-ctx.Done()
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.keys.Wait()
	})
	return p
}

// Submit queues job under key, waiting while Queue jobs already wait. It
// reports false, without queueing the job, once the pool's context has
// ended.
func (p *Pool[T]) Submit(key string, job T) bool {
	p.mu.Lock()
	for p.limit > 0 && p.queued >= p.limit && !p.closed && p.ctx.Err() == nil {
		room := p.room
		p.waiting++
		p.mu.Unlock()
		select {
		case <-room:
		case <-p.ctx.Done():
		}
		p.mu.Lock()
		p.waiting--
	}
	if p.closed || p.ctx.Err() != nil {
		p.mu.Unlock()
		return false
	}
	q, busy := p.queues[key]
	p.queues[key] = append(q, job)
	p.queued++
	if !busy {
		p.keys.Go(func() { p.drain(key) })
	}
	p.mu.Unlock()
	return true
}

// drain runs key's jobs in order until its queue is empty or the pool's
// context ends, which drops what is left.
func (p *Pool[T]) drain(key string) {
	for {
		p.mu.Lock()
		if q := p.queues[key]; len(q) == 0 || p.ctx.Err() != nil {
			delete(p.queues, key)
			p.take(len(q))
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		if p.slots != nil {
			select {
			case p.slots <- struct{}{}:
			case <-p.ctx.Done():
				continue // the top of the loop drops the rest
			}
		}
		// Only this goroutine takes from key's queue: its head is still
		// the job it saw.
		p.mu.Lock()
		q := p.queues[key]
		job := q[0]
		var zero T
		q[0] = zero
		p.queues[key] = q[1:]
		p.take(1)
		p.mu.Unlock()
		p.run(p.ctx, job)
		if p.slots != nil {
			<-p.slots
		}
	}
}

// take counts n jobs out of the queues and wakes any Submit waiting for
// room. p.mu is held.
func (p *Pool[T]) take(n int) {
	p.queued -= n
	if n > 0 && p.waiting > 0 {
		close(p.room)
		p.room = make(chan struct{})
	}
}

// Len is how many keys have jobs queued or running.
func (p *Pool[T]) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queues)
}
