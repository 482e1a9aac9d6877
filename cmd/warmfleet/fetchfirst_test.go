package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestRunShowsFetchFirst(t *testing.T) { asEachReader(t, testRunShowsFetchFirst) }

// run get says what a queued Run waits for on its node (its bytes, and
// when they are expected, or room), and run decision how the winner was
// booked.
func testRunShowsFetchFirst(t *testing.T) {
	b := newLogBus(t)
	t0 := time.Now().Add(-time.Minute).UTC()
	ready := t0.Add(90 * time.Second)
	for _, r := range []schemas.Run{
		{ID: "r-f", Phase: schemas.PhasePreparing, Attempt: 1, NodeID: "n1", Queued: true, AwaitsBytes: true, ReadyBy: &ready, CreatedAt: t0},
		{ID: "r-q", Phase: schemas.PhasePlaced, Attempt: 1, NodeID: "n2", Queued: true, CreatedAt: t0},
	} {
		v, _ := json.Marshal(r)
		if _, err := b.kv.Put(context.Background(), r.ID, v); err != nil {
			t.Fatal(err)
		}
	}
	b.event(schemas.RunEvent{RunID: "r-f", Seq: 1, Type: schemas.EventDecided, Phase: schemas.PhaseAccepted, At: t0,
		Decision: &schemas.BookingDecision{RunID: "r-f", Attempt: 1, Winner: "n1", FetchFirst: true, DecidedAt: t0}})
	for id, want := range map[string]string{
		"r-f": "its image and artifacts, on n1; it takes its cards once they are there (expected by " + ready.Format(time.RFC3339) + ")",
		"r-q": "room on n2; its bytes are prepared there meanwhile",
	} {
		var stdout, stderr syncBuffer
		if err := cliOut(b.url, &stdout, &stderr, "run", "get", id); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stdout.String(), "Queued:") || !strings.Contains(stdout.String(), want) {
			t.Errorf("run get %s: no Queued line %q in\n%s", id, want, stdout.String())
		}
	}
	var stdout, stderr syncBuffer
	if err := cliOut(b.url, &stdout, &stderr, "run", "decision", "r-f"); err != nil {
		t.Fatal(err)
	}
	if want := "winner n1 (fetching the Run's bytes first; it takes its cards once they are there)"; !strings.Contains(stdout.String(), want) {
		t.Errorf("run decision: no %q in\n%s", want, stdout.String())
	}
}
