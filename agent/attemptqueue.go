package agent

import (
	"context"
	"sync"
)

// attemptQueues applies work in order per key — an attempt's commands:
// prepare before launch before stop — with one goroutine per key that has
// work, so a slow image pull for one Run never holds up a stop for another.
//
// A push never waits: what bounds the queues is the command consumer's
// MaxAckPending, since a command stays unacked until it is applied. A key's
// goroutine exits when, under the same lock a push takes, it finds its queue
// empty; the next push starts a new one.
type attemptQueues[T any] struct {
	mu     sync.Mutex
	queues map[string][]T
	apply  func(context.Context, T)
	// spawn starts a key's goroutine under the owner's WaitGroup.
	spawn func(func())
}

func newAttemptQueues[T any](apply func(context.Context, T), spawn func(func())) *attemptQueues[T] {
	return &attemptQueues[T]{queues: map[string][]T{}, apply: apply, spawn: spawn}
}

// push queues item under key.
func (s *attemptQueues[T]) push(ctx context.Context, key string, item T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, busy := s.queues[key]
	s.queues[key] = append(q, item)
	if !busy {
		s.spawn(func() { s.drain(ctx, key) })
	}
}

// drain applies key's items in order until its queue is empty, or ctx ends
// (shutdown: what is left stays unapplied and unacked, so it is redelivered).
func (s *attemptQueues[T]) drain(ctx context.Context, key string) {
	for ctx.Err() == nil {
		s.mu.Lock()
		q := s.queues[key]
		if len(q) == 0 {
			delete(s.queues, key)
			s.mu.Unlock()
			return
		}
		item := q[0]
		var zero T
		q[0] = zero
		s.queues[key] = q[1:]
		s.mu.Unlock()
		s.apply(ctx, item)
	}
}
