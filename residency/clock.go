package residency

import "time"

// Clock is the time source of leases, heartbeats, fences and warm
// countdowns. Tests inject a fake one.
type Clock interface {
	Now() time.Time
	// NewTimer fires once on C after d.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f once after d, on a goroutine of the clock's own.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a one-shot timer of a Clock.
type Timer interface {
	// C is the expiry channel; nil for a timer made by AfterFunc.
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now.
func (SystemClock) Now() time.Time { return time.Now() }

// NewTimer wraps time.NewTimer.
func (SystemClock) NewTimer(d time.Duration) Timer { return sysTimer{time.NewTimer(d)} }

// AfterFunc wraps time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer {
	return sysTimer{time.AfterFunc(d, f)}
}

type sysTimer struct{ t *time.Timer }

func (s sysTimer) C() <-chan time.Time        { return s.t.C }
func (s sysTimer) Stop() bool                 { return s.t.Stop() }
func (s sysTimer) Reset(d time.Duration) bool { return s.t.Reset(d) }
