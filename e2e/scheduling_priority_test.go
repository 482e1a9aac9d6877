package e2e

import (
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// priorityPolicy: urgent preempts, batch is the default class.
var priorityPolicy = schemas.SchedulingPolicy{
	PriorityClasses: []schemas.PriorityClass{{Name: "urgent", Value: 1000, Preempts: true}, {Name: "batch", Value: 0}},
	DefaultPriority: "batch",
}

// TestAcceptance_PriorityAndPreemption: two one-slot nodes. Full of
// non-preemptible batch Runs, an urgent Run waits and nobody is stopped;
// it runs once one of them is cancelled. Full again, now with a
// preemptible batch Run beside a non-preemptible one, an urgent Run
// preempts the preemptible one alone: its decision names the victim, the
// victim goes back to accepted with reason preempted, the urgent Run runs
// where it ran, and the victim later runs again and succeeds. The
// non-preemptible Run is never touched.
func TestAcceptance_PriorityAndPreemption(t *testing.T) {
	f := newFleet(t, withPolicy(t, priorityPolicy))
	nodes := []*noopNode{f.startNoopNode(noopNodeSpec{id: "prio-1"}), f.startNoopNode(noopNodeSpec{id: "prio-2"})}

	// A full fleet of non-preemptible batch Runs: the urgent Run waits.
	keep1 := f.submit(noopRun("keep-1", nil))
	keep2 := f.submit(noopRun("keep-2", nil))
	k1 := f.waitPhase(keep1, schemas.PhaseRunning, 30*time.Second)
	k2 := f.waitPhase(keep2, schemas.PhaseRunning, 30*time.Second)
	u1req := noopRun("urgent-1", exitAfter(500*time.Millisecond))
	u1req.Priority = "urgent"
	urgent1 := f.submit(u1req)
	f.waitRun(urgent1, "a recorded wait", 20*time.Second, func(r schemas.Run) bool { return r.Waiting != "" || r.WaitCode != "" })
	time.Sleep(3 * time.Second) // many passes
	if r, _ := f.run(urgent1); r.Phase != schemas.PhaseAccepted || r.NodeID != "" {
		t.Fatalf("the urgent Run is %s on %q while only non-preemptible Runs hold the fleet; want it waiting", r.Phase, r.NodeID)
	}
	for _, before := range []schemas.Run{k1, k2} {
		after, _ := f.run(before.ID)
		unchanged(t, before, after)
		if evs := f.events(before.ID); len(requeued(evs, schemas.CodePreempted)) != 0 {
			t.Errorf("non-preemptible %s was preempted: %+v", before.ID, evs)
		}
	}
	if v := victimsNamed(f.events(urgent1)); len(v) != 0 {
		t.Errorf("the urgent Run's decisions name victims %+v; no Run was preemptible", v)
	}
	// Cancelling one frees its slot, which the urgent Run takes.
	f.cancelAs(schemas.DefaultTenant, keep1)
	f.waitPhase(keep1, schemas.PhaseCancelled, 30*time.Second)
	if r := f.waitPhase(urgent1, schemas.PhaseSucceeded, 30*time.Second); r.NodeID != k1.NodeID {
		t.Errorf("the urgent Run ran on %s, want %s, which the cancel freed", r.NodeID, k1.NodeID)
	}

	// Full again: the non-preemptible keep-2 and a preemptible batch Run.
	// Its workload would end by itself well after the preemption is due.
	preq := noopRun("preemptible-1", exitAfter(8*time.Second))
	preq.Preemptible, preq.GraceSeconds = true, 1
	victim := f.submit(preq)
	v1 := f.waitPhase(victim, schemas.PhaseRunning, 30*time.Second)
	u2req := noopRun("urgent-2", exitAfter(500*time.Millisecond))
	u2req.Priority = "urgent"
	urgent2 := f.submit(u2req)

	requeuedRun := f.waitRun(victim, "requeued as preempted", 30*time.Second, func(r schemas.Run) bool {
		if r.Phase == schemas.PhaseSucceeded && r.Preemptions == 0 {
			t.Fatalf("the preemptible Run finished its first attempt: it was never preempted")
		}
		return r.Preemptions >= 1
	})
	if requeuedRun.Reason != string(schemas.CodePreempted) && requeuedRun.Phase == schemas.PhaseAccepted {
		t.Errorf("requeued victim's reason %q, want %s", requeuedRun.Reason, schemas.CodePreempted)
	}
	u2 := f.waitPhase(urgent2, schemas.PhaseSucceeded, 30*time.Second)
	if u2.NodeID != v1.NodeID {
		t.Errorf("the urgent Run ran on %s, want %s, where its victim ran", u2.NodeID, v1.NodeID)
	}
	var named []schemas.Victim
	for _, ev := range f.events(urgent2) {
		if ev.Decided() && ev.Decision != nil && len(ev.Decision.Victims) > 0 {
			if ev.Code != schemas.CodePreempting {
				t.Errorf("the decision naming victims has code %q, want %s", ev.Code, schemas.CodePreempting)
			}
			named = append(named, ev.Decision.Victims...)
		}
	}
	if len(named) == 0 || !slices.ContainsFunc(named, func(v schemas.Victim) bool {
		return v.RunID == victim && v.NodeID == v1.NodeID && v.Why == "priority"
	}) || slices.ContainsFunc(named, func(v schemas.Victim) bool { return v.RunID != victim }) {
		t.Errorf("the urgent Run's decisions name victims %+v; want %s on %s, why priority, and no other", named, victim, v1.NodeID)
	}

	// The victim runs again and finishes; its first attempt ended preempted.
	done := f.waitPhase(victim, schemas.PhaseSucceeded, 40*time.Second)
	evs := f.events(victim)
	if back := requeued(evs, schemas.CodePreempted); len(back) != 1 || back[0].Attempt != v1.Attempt {
		t.Errorf("victim's requeue events %+v; want one, from attempt %d", back, v1.Attempt)
	}
	if done.Attempt < 2 || done.Preemptions != 1 || len(done.Attempts) < 2 || done.Attempts[0].Outcome != schemas.CodePreempted {
		t.Errorf("victim ended after %d attempts, %d preemptions, records %+v; want a preempted first attempt and a second that succeeded",
			done.Attempt, done.Preemptions, done.Attempts)
	}
	// keep-2 ran through all of it on its first attempt, never stopped.
	after, _ := f.run(keep2)
	unchanged(t, k2, after)
	if !slices.Contains(nodeOf(t, nodes, k2.NodeID).running(t), k2.AttemptID) {
		t.Errorf("keep-2's workload %s no longer runs on %s", k2.AttemptID, k2.NodeID)
	}
}

// nodeOf is the node of nodes with id.
func nodeOf(t *testing.T, nodes []*noopNode, id string) *noopNode {
	t.Helper()
	for _, n := range nodes {
		if n.id == id {
			return n
		}
	}
	t.Fatalf("no node %q", id)
	return nil
}
