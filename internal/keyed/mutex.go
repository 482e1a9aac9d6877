package keyed

import (
	"context"
	"sync"
)

// Mutex is a set of mutexes, one per key. Holders of one key exclude each
// other; holders of different keys never wait on each other. The zero value
// is ready to use; a Mutex must not be copied after first use.
type Mutex struct {
	mu    sync.Mutex
	locks map[string]*lockEntry
}

type lockEntry struct {
	held chan struct{} // capacity 1: full while held
	refs int           // holders and waiters; the entry goes at zero
}

// Lock waits for key and returns the function that releases it, to be
// called once.
func (m *Mutex) Lock(key string) (unlock func()) {
	unlock, _ = m.LockContext(context.Background(), key)
	return unlock
}

// LockContext is Lock that gives up when ctx ends first, returning
// ctx.Err() and no unlock.
func (m *Mutex) LockContext(ctx context.Context, key string) (unlock func(), err error) {
	m.mu.Lock()
	if m.locks == nil {
		m.locks = map[string]*lockEntry{}
	}
	e := m.locks[key]
	if e == nil {
		e = &lockEntry{held: make(chan struct{}, 1)}
		m.locks[key] = e
	}
	e.refs++
	m.mu.Unlock()

	release := func() {
		m.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(m.locks, key)
		}
		m.mu.Unlock()
	}
	select {
	case e.held <- struct{}{}:
		return func() { <-e.held; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// Len is how many keys are held or waited for.
func (m *Mutex) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.locks)
}
