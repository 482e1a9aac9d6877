package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_StartDeadline: one one-slot node runs a long Run, and
// another waits behind it. A Run with a three-second start deadline cannot
// start in time: it ends failed deadline_exceeded, having held nothing (no
// time held, no cost), and nothing it did not hold changes: the running
// Run still runs on its first attempt, the waiting one still waits, and
// neither has a new event. Then a Run booked to fetch its image first on a
// node still pulling it at its deadline ends failed deadline_exceeded at
// the deadline, having held nothing, and nothing is launched there.
func TestAcceptance_StartDeadline(t *testing.T) {
	f := newFleet(t, withPolicy(t, schemas.SchedulingPolicy{}))
	busy := f.startNoopNode(noopNodeSpec{id: "deadline-busy"})
	long := f.waitPhase(f.submit(noopRun("long", nil)), schemas.PhaseRunning, 30*time.Second)
	behind := f.submit(noopRun("behind", nil))
	f.waitRun(behind, "booked in the queue or waiting", 20*time.Second, func(r schemas.Run) bool {
		return r.Queued || r.Waiting != "" || r.WaitCode != ""
	})
	time.Sleep(500 * time.Millisecond) // let its wait be recorded in full
	behindBefore, _ := f.run(behind)

	req := noopRun("too-late", exitAfter(100*time.Millisecond))
	req.StartDeadlineSeconds = 3
	late := f.submit(req)
	failed := f.waitPhase(late, "", 30*time.Second)
	if failed.Phase != schemas.PhaseFailed || failed.Reason != string(schemas.CodeDeadlineExceeded) {
		t.Fatalf("the Run ended %s (%s), want failed %s", failed.Phase, failed.Reason, schemas.CodeDeadlineExceeded)
	}
	if at := failed.PhaseSince; at.Before(failed.CreatedAt.Add(3 * time.Second)) {
		t.Errorf("the Run failed at %v, before its deadline %v", at, failed.CreatedAt.Add(3*time.Second))
	}
	if failed.StartedAt != nil || failed.CostUSD != 0 || slices.ContainsFunc(failed.Attempts, func(a schemas.AttemptRecord) bool { return a.HeldFrom != nil || a.CostUSD != 0 }) {
		t.Errorf("the Run that never started held something: started %v, cost %.4f, attempts %+v", failed.StartedAt, failed.CostUSD, failed.Attempts)
	}
	for _, ev := range f.events(late) {
		if ev.Type == schemas.EventPhase && ev.Phase == schemas.PhaseRunning {
			t.Errorf("the Run reached running: %+v", ev)
		}
	}
	longAfter, _ := f.run(long.ID)
	unchanged(t, long, longAfter)
	behindAfter, _ := f.run(behind)
	unchanged(t, behindBefore, behindAfter)
	if running := busy.running(t); !slices.Equal(running, []string{long.AttemptID}) {
		t.Errorf("the node runs %v, want only the long Run's %s", running, long.AttemptID)
	}

	// A node that takes ten seconds to pull the image: a Run booked there
	// fetches it first and holds nothing until it is there, so at its
	// two-second deadline it fails at once, having held nothing, and
	// nothing is launched. (The Run behind goes first, so the new node is
	// free for it.)
	f.cancelAs(schemas.DefaultTenant, behind)
	f.waitPhase(behind, schemas.PhaseCancelled, 20*time.Second)
	slowNode := f.startNoopNode(noopNodeSpec{id: "deadline-slow", opts: noopruntime.Options{Images: []string{}, PullDelay: 10 * time.Second}})
	req = noopRun("too-slow", exitAfter(100*time.Millisecond))
	req.StartDeadlineSeconds = 2
	slow := f.submit(req)
	booked := f.waitRun(slow, "booked", 10*time.Second, func(r schemas.Run) bool { return r.NodeID != "" || r.Phase.Terminal() })
	if booked.NodeID != "deadline-slow" || !booked.Queued || !booked.AwaitsBytes {
		t.Fatalf("the Run went to %q (queued %v, awaits bytes %v, %s), want deadline-slow, fetching its image first", booked.NodeID, booked.Queued, booked.AwaitsBytes, booked.Phase)
	}
	stopped := f.waitPhase(slow, "", 30*time.Second)
	if stopped.Phase != schemas.PhaseFailed || stopped.Reason != string(schemas.CodeDeadlineExceeded) {
		t.Errorf("the fetching Run ended %s (%s), want failed %s", stopped.Phase, stopped.Reason, schemas.CodeDeadlineExceeded)
	}
	// It fails at the deadline, not when the pull ends.
	deadline := stopped.CreatedAt.Add(2 * time.Second)
	if at := stopped.PhaseSince; at.Before(deadline) || at.After(deadline.Add(5*time.Second)) {
		t.Errorf("the Run failed at %v; want soon after its deadline %v, before the pull ended", at, deadline)
	}
	if stopped.StartedAt != nil || stopped.CostUSD != 0 || slices.ContainsFunc(stopped.Attempts, func(a schemas.AttemptRecord) bool { return a.HeldFrom != nil }) {
		t.Errorf("the fetching Run held something: started %v, cost %.4f, attempts %+v", stopped.StartedAt, stopped.CostUSD, stopped.Attempts)
	}
	time.Sleep(11 * time.Second) // past the pull: a launch would have run by now
	if list, err := slowNode.rt.List(context.Background()); err != nil || len(list) != 0 {
		t.Errorf("deadline-slow has workloads %+v (%v); the Run failed before it held a place, so nothing is launched", list, err)
	}
	longAfter, _ = f.run(long.ID)
	unchanged(t, long, longAfter)
}
