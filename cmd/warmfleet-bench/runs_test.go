package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestInterleaveDropsWarmUpAndRotates: the warm-up samples are taken but
// not kept, the numbering runs on across them, and each sample starts with
// the next kind, so every kind goes first as often as the others.
func TestInterleaveDropsWarmUpAndRotates(t *testing.T) {
	var calls []string
	kind := func(name string, d time.Duration) roundTrip {
		return roundTrip{name: name, once: func(_ context.Context, i int) (time.Duration, error) {
			calls = append(calls, fmt.Sprintf("%s%d", name, i))
			return d + time.Duration(i), nil
		}}
	}
	out, err := interleave(context.Background(), sampling{warmup: 2, samples: 3}, kind("a", 100), kind("b", 200))
	if err != nil {
		t.Fatal(err)
	}
	want := "[a0 b0 b1 a1 a2 b2 b3 a3 a4 b4]"
	if got := fmt.Sprint(calls); got != want {
		t.Fatalf("calls %s, want %s", got, want)
	}
	if fmt.Sprint(out) != "[[102ns 103ns 104ns] [202ns 203ns 204ns]]" {
		t.Fatalf("kept %v: want samples 2 to 4 of each kind", out)
	}
}

// TestRunTimingsFoldSkippedPhases: stages run between the phases a Run
// passed through, a skipped phase folding into the next stage; a Run that
// never ran is no sample.
func TestRunTimingsFoldSkippedPhases(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	r := newRunTimings()
	r.add(runEnd{submitted: t0, accepted: at(2),
		phases: map[schemas.Phase]time.Time{schemas.PhasePlaced: at(5), schemas.PhaseLaunching: at(9), schemas.PhaseRunning: at(20)},
		seen:   map[schemas.Phase]time.Time{schemas.PhaseRunning: at(21)}})
	r.add(runEnd{submitted: t0, phases: map[schemas.Phase]time.Time{schemas.PhaseFailed: at(3)}})
	want := map[string]time.Duration{"submit→accepted": 2 * time.Millisecond, "accepted→placed": 3 * time.Millisecond,
		"placed→launching": 4 * time.Millisecond, "launching→running": 11 * time.Millisecond, "submit→running": 21 * time.Millisecond}
	if len(r.byStage) != len(want) || len(r.submitToRunning) != 1 || r.placedToRunning[0] != 15*time.Millisecond {
		t.Fatalf("stages %v, submit→running %v, placed→running %v", r.byStage, r.submitToRunning, r.placedToRunning)
	}
	for k, d := range want {
		if got := r.byStage[k]; len(got) != 1 || got[0] != d {
			t.Fatalf("%s = %v, want %v", k, got, d)
		}
	}
}

// TestUndoRunsLastFirstOnce: cleanups run in reverse, and a second run
// runs nothing.
func TestUndoRunsLastFirstOnce(t *testing.T) {
	var got []int
	var u undo
	for i := range 3 {
		u.push(func() { got = append(got, i) })
	}
	u.run()
	u.run()
	if fmt.Sprint(got) != "[2 1 0]" {
		t.Fatalf("ran %v", got)
	}
}
