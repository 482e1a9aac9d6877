package residency

import (
	"fmt"
	"sync"
)

// Admissions is the host's ONE admission ledger and its drain flag. The
// Manager, the heartbeat and the warm release all take this same object, so
// "draining" has one source: an attach admitted just before a drain began
// publishes accepting=false, because the observation reads Draining() from
// here.
type Admissions interface {
	// Admit charges one session. It is idempotent for a key already charged.
	// It refuses with ErrDraining once draining and ErrCapacity when full.
	Admit(Key) error
	// Release credits a session's charge back whoever owns it. For an
	// operator's forced cleanup; every residency path uses ReleaseOwned.
	Release(Key) bool
	// Own binds the session's charge to the residency generation that
	// installed it and reports whether it now belongs to that generation.
	Own(Key, uint64) bool
	// ReleaseOwned credits the charge back only while it still belongs to
	// the given generation, so a residency that ends after a successor
	// already claimed the charge does not uncharge the successor.
	ReleaseOwned(Key, uint64) bool
	// Draining reports whether the host has begun draining.
	Draining() bool
}

// Ledger is the directory's Admissions: a fixed number of session slots.
// It is safe for concurrent use.
type Ledger struct {
	mu       sync.Mutex
	capacity int
	draining bool
	charges  map[Key]uint64 // key → owning generation (0: not yet owned)
}

var _ Admissions = (*Ledger)(nil)

// NewLedger returns a ledger admitting up to capacity sessions at once.
func NewLedger(capacity int) (*Ledger, error) {
	if capacity <= 0 {
		return nil, &InvalidOptionsError{Field: "capacity", Reason: fmt.Sprintf("must be positive, got %d", capacity)}
	}
	return &Ledger{capacity: capacity, charges: make(map[Key]uint64)}, nil
}

// Admit implements Admissions.
func (l *Ledger) Admit(k Key) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.draining {
		return ErrDraining
	}
	if _, ok := l.charges[k]; ok {
		return nil
	}
	if len(l.charges) >= l.capacity {
		return fmt.Errorf("%w: %d of %d slots in use", ErrCapacity, len(l.charges), l.capacity)
	}
	l.charges[k] = 0
	return nil
}

// Release implements Admissions.
func (l *Ledger) Release(k Key) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.charges[k]
	delete(l.charges, k)
	return ok
}

// Own implements Admissions.
func (l *Ledger) Own(k Key, gen uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.charges[k]; !ok {
		return false
	}
	l.charges[k] = gen
	return true
}

// ReleaseOwned implements Admissions.
func (l *Ledger) ReleaseOwned(k Key, gen uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g, ok := l.charges[k]; !ok || g != gen {
		return false
	}
	delete(l.charges, k)
	return true
}

// Draining implements Admissions.
func (l *Ledger) Draining() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.draining
}

// BeginDrain makes every later Admit refuse with ErrDraining. It does not
// touch existing charges.
func (l *Ledger) BeginDrain() {
	l.mu.Lock()
	l.draining = true
	l.mu.Unlock()
}

// InUse is the number of sessions charged.
func (l *Ledger) InUse() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.charges)
}

// Charged reports whether k is charged and the generation owning it.
func (l *Ledger) Charged(k Key) (gen uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	gen, ok = l.charges[k]
	return gen, ok
}
