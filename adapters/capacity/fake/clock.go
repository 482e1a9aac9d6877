package fake

import (
	"sync"
	"time"
)

// Clock is where the fake world reads time. Tests inject a ManualClock so
// every latency is virtual: nothing in this package sleeps.
type Clock interface {
	Now() time.Time
}

// Advancer is a Clock that call latency can move forward.
type Advancer interface {
	Clock
	Advance(d time.Duration)
}

// ManualClock is a Clock that moves only when told.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// epoch is where a world's default clock starts: fixed, so traces from two
// runs with one seed are identical.
func epoch() time.Time { return time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC) }

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{now: start} }

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (never backward).
func (c *ManualClock) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
