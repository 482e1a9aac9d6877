package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// fairShareLag is how long after the control plane records a change of
// tenant late's Runs a booking may still miss it: the scheduler sees
// records through its KV watch a moment after they are written.
const fairShareLag = 300 * time.Millisecond

// TestAcceptance_FairShare: four one-slot nodes. Tenant flood submits 500
// Runs of about 300 ms each, then tenant late (equal weight) submits 10.
// From then on, whenever late holds fewer than its share (half the fleet:
// two slots) and has a Run waiting, the next slot that frees goes to one
// of late's Runs: no Run of flood is booked meanwhile (unless flood holds
// no more than late, when the fleet emptied at once). The order of
// bookings is read from both tenants' events.
func TestAcceptance_FairShare(t *testing.T) {
	pol := schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{"flood": {Weight: 1}, "late": {Weight: 1}}}
	f := newFleet(t, withPolicy(t, pol, "flood", "late"))
	for i := range 4 {
		f.startNoopNode(noopNodeSpec{id: fmt.Sprintf("fair-%d", i+1)})
	}
	reqs := make([]schemas.RunRequest, 500)
	for i := range reqs {
		reqs[i] = noopRun(fmt.Sprintf("flood-%03d", i), exitAfter(300*time.Millisecond))
	}
	flood := f.submitManyAs("flood", reqs)
	// The flood has the fleet to itself for a while.
	f.eventually(60*time.Second, "a dozen of flood's Runs done", func() bool {
		done := 0
		for _, id := range flood[:40] {
			if r, ok := f.run(id); ok && r.Phase == schemas.PhaseSucceeded {
				done++
			}
		}
		return done >= 12
	})
	lateReqs := make([]schemas.RunRequest, 10)
	for i := range lateReqs {
		lateReqs[i] = noopRun(fmt.Sprintf("late-%d", i), exitAfter(1500*time.Millisecond))
	}
	late := f.submitManyAs("late", lateReqs)
	for _, id := range late {
		f.waitPhase(id, schemas.PhaseSucceeded, 50*time.Second)
	}

	floodEvents, lateEvents := f.tenantEvents("flood"), f.tenantEvents("late")
	v := checkFairShare(mergeByTime(floodEvents, lateEvents), lateRuns(late), 2)
	for _, s := range v.violations {
		t.Error(s)
	}
	if v.floodWaitingAtEnd == 0 {
		t.Errorf("flood had no Run waiting when late's last Run was booked: the test did not exercise a backlog")
	}
	if v.lateBookings != len(late) || v.maxLateHeld < 2 {
		t.Errorf("late was booked %d times (want %d) and held at most %d slots at once (want its share, 2)", v.lateBookings, len(late), v.maxLateHeld)
	}
	t.Logf("late: %d bookings, at most %d slots, below its share with a Run waiting for at most %s; flood: %d bookings while late had Runs waiting, %d Runs still waiting at the end",
		v.lateBookings, v.maxLateHeld, v.longestBelow, v.floodBookingsDuring, v.floodWaitingAtEnd)
}

func lateRuns(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// mergeByTime merges two time-ordered event lists.
func mergeByTime(a, b []schemas.RunEvent) []schemas.RunEvent {
	out := make([]schemas.RunEvent, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if b[0].At.Before(a[0].At) {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}

// fairShareCheck is what replaying the bookings found.
type fairShareCheck struct {
	violations          []string
	lateBookings        int
	maxLateHeld         int
	floodBookingsDuring int
	floodWaitingAtEnd   int
	// longestBelow is the longest late was below its share with a Run
	// waiting before one of its Runs was booked.
	longestBelow time.Duration
}

// checkFairShare replays evs (both tenants', by time): a Run is waiting
// from its acceptance (or requeue) to its booking and holds a slot from
// its booking to its attempt's end. late (the ids in late) is starved
// while it has a Run waiting and holds fewer than share slots and fewer
// than the other tenant: weighted dominant-resource share then serves it
// first (when the other holds no more, either may be served: the lower
// share, ties to the older wait). A booking of the other tenant's Run
// while late has been starved for longer than fairShareLag is a violation.
func checkFairShare(evs []schemas.RunEvent, late map[string]bool, share int) fairShareCheck {
	var (
		c            fairShareCheck
		lateWaiting  = map[string]bool{}
		lateHeld     = map[string]bool{}
		floodWaiting = map[string]bool{}
		floodHeld    = map[string]bool{}
		below        time.Time // since when late has been starved
	)
	for _, ev := range evs {
		booking := ev.Type == schemas.EventPhase && ev.From == schemas.PhaseAccepted && ev.Phase == schemas.PhasePlaced
		waits := (ev.Type == schemas.EventAccepted && ev.Phase == schemas.PhaseAccepted) ||
			(ev.Type == schemas.EventPhase && ev.Phase == schemas.PhaseAccepted && ev.From != schemas.PhaseAccepted && ev.From != "")
		ends := ev.Type == schemas.EventPhase && ev.From != schemas.PhaseAccepted && ev.From != "" && (ev.Phase.Terminal() || ev.Phase == schemas.PhaseAccepted)
		if !booking && !waits && !ends {
			continue
		}
		waiting, held := floodWaiting, floodHeld
		if late[ev.RunID] {
			waiting, held = lateWaiting, lateHeld
		}
		if ends {
			delete(held, ev.RunID)
		}
		if waits {
			waiting[ev.RunID] = true
		}
		if booking {
			if late[ev.RunID] {
				if !below.IsZero() {
					c.longestBelow = max(c.longestBelow, ev.At.Sub(below))
				}
				c.lateBookings++
				c.floodWaitingAtEnd = len(floodWaiting)
			} else {
				if len(lateWaiting) > 0 {
					c.floodBookingsDuring++
				}
				if !below.IsZero() && ev.At.Sub(below) > fairShareLag {
					c.violations = append(c.violations, fmt.Sprintf("%s booked at %s while late held %d slots (< %d, and < the other tenant's %d) with %d Runs waiting since %s",
						ev.RunID, ev.At.Format("15:04:05.000"), len(lateHeld), share, len(floodHeld), len(lateWaiting), below.Format("15:04:05.000")))
				}
			}
			delete(waiting, ev.RunID)
			held[ev.RunID] = true
			c.maxLateHeld = max(c.maxLateHeld, len(lateHeld))
		}
		starved := len(lateWaiting) > 0 && len(lateHeld) < share && len(lateHeld) < len(floodHeld)
		switch {
		case !starved:
			below = time.Time{}
		case (booking && late[ev.RunID]) || below.IsZero():
			below = ev.At
		}
	}
	return c
}

// TestFairShareCheck: the replay behind TestAcceptance_FairShare flags a
// booking of the flood while late is below its share and the flood's
// holding past the lag, and none when late's Runs are booked first, the
// flood's booking falls within the lag, or the flood holds no more.
func TestFairShareCheck(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	accepted := func(id string, ms int) schemas.RunEvent {
		return schemas.RunEvent{RunID: id, Type: schemas.EventAccepted, Phase: schemas.PhaseAccepted, At: at(ms)}
	}
	booked := func(id string, ms int) schemas.RunEvent {
		return schemas.RunEvent{RunID: id, Type: schemas.EventPhase, From: schemas.PhaseAccepted, Phase: schemas.PhasePlaced, At: at(ms)}
	}
	ended := func(id string, ms int) schemas.RunEvent {
		return schemas.RunEvent{RunID: id, Type: schemas.EventPhase, From: schemas.PhaseRunning, Phase: schemas.PhaseSucceeded, At: at(ms)}
	}
	late := map[string]bool{"l1": true, "l2": true, "l3": true}
	fair := []schemas.RunEvent{
		accepted("f1", 0), accepted("f2", 0), accepted("f3", 0), booked("f1", 10),
		accepted("l1", 100), accepted("l2", 100), accepted("l3", 100),
		booked("l1", 200), booked("l2", 300), booked("f2", 400), // late at its share: f2 may go
		ended("l1", 1000), booked("f3", 1100), booked("l3", 1200), // f3 within the lag of l1's end
	}
	if c := checkFairShare(fair, late, 2); len(c.violations) != 0 || c.lateBookings != 3 || c.maxLateHeld != 2 {
		t.Errorf("fair replay: %+v", c)
	}
	starved := []schemas.RunEvent{
		accepted("f0", 0), booked("f0", 0), accepted("f1", 0), accepted("f2", 0), accepted("l1", 100), booked("f1", 1000), booked("l1", 1100),
	}
	if c := checkFairShare(starved, late, 2); len(c.violations) != 1 {
		t.Errorf("starving replay: %+v, want one violation", c)
	}
	// An empty fleet: the flood holds no more than late, so it may be
	// served first.
	even := []schemas.RunEvent{
		accepted("f1", 0), accepted("f2", 0), accepted("l1", 100), accepted("l2", 100), booked("l1", 200), ended("l1", 300),
		booked("f1", 1000), booked("l2", 1100),
	}
	if c := checkFairShare(even, late, 2); len(c.violations) != 0 {
		t.Errorf("even replay: %+v, want no violation", c)
	}
}
