package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_RunToExitCode: JSON RunRequests published on the default tenant's submit subject
// run in a real container; exit 0 succeeds, exit 3 fails with 3, a cancel
// ends cancelled, a max runtime ends failed, and each Run's events tell the
// story in order.
func TestAcceptance_RunToExitCode(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	f.startAgent(agentSpec{id: "node-a", world: w})

	// Published as raw JSON, exactly what `nats pub wf.runs.default.operator.submit '<json>'` sends.
	okBody := fmt.Sprintf(`{"request_id":"exit-0","image":%q,"command":["sh","-c","echo hello; test \"$GREETING\" = hi"],"env":{"GREETING":"hi"},"resources":{"cpu_millis":100,"memory_bytes":67108864}}`, w.image.Reference)
	f.publish(bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), []byte(okBody), "exit-0")
	okID := schemas.RunIDFor(schemas.DefaultTenant, "exit-0")
	failID := f.submit(schemas.RunRequest{RequestID: "exit-3", Image: w.image.Reference, Command: []string{"sh", "-c", "exit 3"}})

	ok := f.waitPhase(okID, schemas.PhaseSucceeded, 60*time.Second)
	if ok.ExitCode == nil || *ok.ExitCode != 0 || ok.StartedAt == nil || ok.FinishedAt == nil || ok.NodeID != "node-a" {
		t.Fatalf("succeeded run: exit %v started %v finished %v node %q", ok.ExitCode, ok.StartedAt, ok.FinishedAt, ok.NodeID)
	}
	failed := f.waitPhase(failID, schemas.PhaseFailed, 60*time.Second)
	if failed.ExitCode == nil || *failed.ExitCode != 3 || failed.Reason != string(schemas.CodeExitNonZero) {
		t.Fatalf("failed run: exit %v reason %q", failed.ExitCode, failed.Reason)
	}

	// Cancel a long sleeper once it runs: SIGTERM, grace, then SIGKILL
	// (busybox sh ignores nothing, so TERM ends it).
	sleepID := f.submit(schemas.RunRequest{RequestID: "sleeper", Image: w.image.Reference, Command: []string{"sleep", "300"}})
	f.waitPhase(sleepID, schemas.PhaseRunning, 60*time.Second)
	f.publish(bus.CancelSubject(schemas.DefaultTenant, bus.OperatorUser), []byte(`{"run_id":"`+sleepID+`","grace_seconds":1,"reason":"operator asked"}`), "")
	cancelled := f.waitPhase(sleepID, schemas.PhaseCancelled, 30*time.Second)
	if cancelled.Reason != string(schemas.CodeCancelled) {
		t.Fatalf("cancelled run reason %q", cancelled.Reason)
	}

	// Max runtime: the node stops it and the Run fails with that reason.
	slowID := f.submit(schemas.RunRequest{RequestID: "too-slow", Image: w.image.Reference, Command: []string{"sleep", "300"}, MaxRuntimeSeconds: 1})
	slow := f.waitPhase(slowID, schemas.PhaseFailed, 60*time.Second)
	if slow.Reason != string(schemas.CodeMaxRuntime) {
		t.Fatalf("max-runtime run reason %q", slow.Reason)
	}

	wantStory := map[string][]schemas.Phase{
		okID:    {schemas.PhaseAccepted, schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning, schemas.PhaseSucceeded},
		failID:  {schemas.PhaseAccepted, schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning, schemas.PhaseFailed},
		sleepID: {schemas.PhaseAccepted, schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning, schemas.PhaseCancelled},
		slowID:  {schemas.PhaseAccepted, schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning, schemas.PhaseFailed},
	}
	for id, want := range wantStory {
		evs := f.events(id)
		var phases []schemas.Phase
		decided := false
		for i, ev := range evs {
			if ev.Seq != uint64(i+1) {
				t.Fatalf("run %s: event %d has seq %d; the log must be gapless and ordered", id, i, ev.Seq)
			}
			if ev.Type == schemas.EventAccepted || ev.Type == schemas.EventPhase {
				phases = append(phases, ev.Phase)
			}
			if ev.Decided() && ev.Decision != nil && ev.Decision.Winner == "node-a" {
				decided = true
			}
		}
		if !slices.Equal(phases, want) {
			t.Errorf("run %s: phases %v, want %v", id, phases, want)
		}
		if !decided {
			t.Errorf("run %s: no booking decision naming node-a in %d events", id, len(evs))
		}
		last := evs[len(evs)-1]
		if last.ObservedAt == nil || last.At.IsZero() {
			t.Errorf("run %s: terminal event lacks the node's observed time or the control plane's", id)
		}
	}
	checkFetchedFirst(t, okID, f.events(okID), ok)
	// Duplicate submit of a finished request: still one Run, no new events.
	before := len(f.events(okID))
	f.publish(bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), []byte(okBody), "")
	f.waitHandled(bus.RunsStream(schemas.DefaultTenant), bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), 30*time.Second) // the duplicate handled
	if r, _ := f.run(okID); r.Phase != schemas.PhaseSucceeded || len(f.events(okID)) != before {
		t.Fatalf("a duplicate submit changed the run: phase %s, events %d → %d", r.Phase, before, len(f.events(okID)))
	}
	if s := strings.Join(phaseNames(f.events(failID)), ","); !strings.Contains(s, "failed") {
		t.Fatalf("failed run's events: %s", s)
	}
}

// checkFetchedFirst: the first Run of an image its node lacks is booked
// there to fetch it first, leaves the node's queue once the node reports it
// prepared, and holds its place from then on, not from its booking.
func checkFetchedFirst(t *testing.T, id string, evs []schemas.RunEvent, r schemas.Run) {
	t.Helper()
	fetchFirst, prepared, left := false, time.Time{}, false
	for _, ev := range evs {
		switch {
		case ev.Decided() && ev.Decision != nil:
			fetchFirst = ev.Decision.FetchFirst && !ev.Decision.WinnerQueued
		case ev.Type == schemas.EventPhase && ev.Phase == schemas.PhaseLaunching:
			prepared = ev.At
		case ev.Type == schemas.EventNote && strings.HasPrefix(ev.Message, "left the queue"):
			left = !prepared.IsZero() // after the prepared report, never before
		}
	}
	if !fetchFirst || !left {
		t.Fatalf("run %s: decided to fetch first %v, left the queue once prepared %v; events %v", id, fetchFirst, left, phaseNames(evs))
	}
	if a := r.Attempts[len(r.Attempts)-1]; a.HeldFrom == nil || a.HeldFrom.Before(prepared) {
		t.Errorf("run %s: its attempt holds its place from %v, before its bytes were there (%v)", id, a.HeldFrom, prepared)
	}
}

func phaseNames(evs []schemas.RunEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, string(e.Type)+":"+string(e.Phase))
	}
	return out
}
