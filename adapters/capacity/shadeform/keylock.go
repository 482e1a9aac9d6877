package shadeform

import (
	"context"
	"sync"
)

// keyLock serializes work per key. Shadeform has no idempotency key, so two
// provisions racing with one OperationKey in this process would both see
// "not created yet" and both create; holding the key's lock across
// list-then-create closes that window. (Across processes the control
// plane's CAS on the rental is what keeps one caller per key.)
type keyLock struct {
	mu    sync.Mutex
	locks map[string]*keyEntry
}

type keyEntry struct {
	held  chan struct{} // capacity 1: full while held
	users int           // holders and waiters; the entry goes when it reaches 0
}

// lock takes key's lock, or gives up when ctx ends, and returns its release.
func (l *keyLock) lock(ctx context.Context, key string) (unlock func(), err error) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[string]*keyEntry{}
	}
	e := l.locks[key]
	if e == nil {
		e = &keyEntry{held: make(chan struct{}, 1)}
		l.locks[key] = e
	}
	e.users++
	l.mu.Unlock()

	release := func() {
		l.mu.Lock()
		if e.users--; e.users == 0 {
			delete(l.locks, key)
		}
		l.mu.Unlock()
	}
	select {
	case e.held <- struct{}{}:
		return func() { <-e.held; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}
