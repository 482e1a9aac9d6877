package rentals

import (
	"errors"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/schemas"
)

func candidate(id string, eligible bool, queue, start float64, image string, pullBytes int64) schemas.Candidate {
	return schemas.Candidate{NodeID: id, Eligible: eligible, Components: schemas.ScoreComponents{
		QueueSeconds: queue, StartSeconds: start, ImageState: image, PullBytes: pullBytes}}
}

func TestQueueAndPull(t *testing.T) {
	const unknown, bps = 1 << 30, 1 << 20
	cases := []struct {
		name        string
		cands       []schemas.Candidate
		queue, pull float64
		ok          bool
	}{
		{"soonest busy node, image size from a cold node", []schemas.Candidate{
			candidate("a", true, 300, 300, "hot", 0),
			candidate("b", true, 120, 130, "cold", 10<<20),
			candidate("c", false, 0, 0, "cold", 20<<20), // a cold ineligible node still quotes the size
		}, 130, 20, true},
		{"every node hot: size unknown", []schemas.Candidate{candidate("a", true, 60, 60, "hot", 0)}, 60, 1024, true},
		{"a node fits now (lost on price): not a queue", []schemas.Candidate{
			candidate("a", true, 60, 60, "hot", 0), candidate("b", true, 0, 5, "cold", 1<<20)}, 0, 0, false},
		{"nothing fits", []schemas.Candidate{candidate("a", false, 0, 0, "", 0)}, 0, 0, false},
	}
	for _, c := range cases {
		q, p, ok := queueAndPull(schemas.BookingDecision{Candidates: c.cands}, unknown, bps)
		if ok != c.ok || (ok && (q != c.queue || p != c.pull)) {
			t.Errorf("%s: got queue %v pull %v ok %v; want %v %v %v", c.name, q, p, ok, c.queue, c.pull, c.ok)
		}
	}
}

// TestRentalStageTimes: a stage is dated by the provider's own account when
// it gives one, and otherwise recorded as a bound at the control plane's
// look, labelled so; a provider time ahead of ours is a bound too.
func TestRentalStageTimes(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	since := now.Add(-42 * time.Second)
	rt := schemas.Rental{State: schemas.RentalProvisioning}
	if err := setRentalState(&rt, rentalStateOf(rt.State, capacity.Observation{State: capacity.StateRunning, StateSince: since}), since, now); err != nil {
		t.Fatal(err)
	}
	if got := rt.Stages[0]; got.State != schemas.RentalEnrolling || !got.At.Equal(since) || got.Bound || got.Source != schemas.StageFromProvider {
		t.Fatalf("stage from the provider's StateSince: %+v", got)
	}
	if err := setRentalState(&rt, schemas.RentalReady, time.Time{}, now); err != nil {
		t.Fatal(err)
	}
	if got := rt.Stages[1]; !got.At.Equal(now) || !got.Bound || got.Source != schemas.StageObserved {
		t.Fatalf("stage without a provider time: %+v", got)
	}
	if err := setRentalState(&rt, schemas.RentalStopping, now.Add(time.Hour), now); err != nil {
		t.Fatal(err)
	}
	if got := rt.Stages[2]; !got.At.Equal(now) || !got.Bound || got.Source != schemas.StageObserved {
		t.Fatalf("stage dated in our future: %+v", got)
	}
	enrolled := now.Add(-time.Second)
	if err := setRentalStateBy(&rt, schemas.RentalStopped, enrolled, schemas.StageFromControlPlane, now); err != nil {
		t.Fatal(err)
	}
	if got := rt.Stages[3]; !got.At.Equal(enrolled) || got.Bound || got.Source != schemas.StageFromControlPlane {
		t.Fatalf("stage of the control plane's own act: %+v", got)
	}
	if err := setRentalState(&rt, schemas.RentalRequested, time.Time{}, now); !errors.Is(err, lifecycle.ErrIllegalTransition) {
		t.Fatalf("stopping → requested: %v", err)
	}
}

// TestRentalTransitions_ResumeCycle: stopped → booting (resume) →
// enrolling → ready → stopping → stopped is a legal cycle, repeatable.
func TestRentalTransitions_ResumeCycle(t *testing.T) {
	path := []schemas.RentalState{schemas.RentalReady, schemas.RentalStopping, schemas.RentalStopped, schemas.RentalBooting,
		schemas.RentalEnrolling, schemas.RentalReady, schemas.RentalStopping, schemas.RentalStopped, schemas.RentalTerminating, schemas.RentalTerminated}
	for i := 1; i < len(path); i++ {
		if err := checkRentalTransition(path[i-1], path[i]); err != nil {
			t.Errorf("%v", err)
		}
	}
	for _, to := range []schemas.RentalState{schemas.RentalReady, schemas.RentalEnrolling, schemas.RentalRequested} {
		if checkRentalTransition(schemas.RentalStopped, to) == nil {
			t.Errorf("stopped → %s is allowed; a resume must boot first", to)
		}
	}
}

// TestLossCause: attempts on a rental its provider interrupted, or
// terminated without being asked, end interrupted; on one we were
// terminating, or that failed, node_lost.
func TestLossCause(t *testing.T) {
	for _, c := range []struct {
		from, to schemas.RentalState
		want     schemas.Code
	}{
		{schemas.RentalReady, schemas.RentalInterrupted, schemas.CodeInterrupted},
		{schemas.RentalReady, schemas.RentalTerminated, schemas.CodeInterrupted},
		{schemas.RentalTerminating, schemas.RentalTerminated, schemas.CodeNodeLost},
		{schemas.RentalReady, schemas.RentalFailed, schemas.CodeNodeLost},
	} {
		if got := lossCause(c.from, c.to); got != c.want {
			t.Errorf("%s → %s: %s, want %s", c.from, c.to, got, c.want)
		}
	}
}
