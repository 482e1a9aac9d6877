package scheduler

import (
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// A booking holds its place from its start until its max runtime, or
// placement's UnknownRuntime, has passed; a queued one has not started.
func TestBooking(t *testing.T) {
	s := &Scheduler{cfg: Config{Placement: placement.Config{UnknownRuntime: 10 * time.Minute}}}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	since, started := now.Add(-5*time.Minute), now.Add(-3*time.Minute)
	req := func(maxSeconds int64) schemas.RunRequest {
		return schemas.RunRequest{Resources: schemas.Resources{CPUMillis: 500, GPUCount: 1}, MaxRuntimeSeconds: maxSeconds, GPU: &schemas.GPURequirement{Model: "H100"}}
	}
	for _, tc := range []struct {
		name string
		run  schemas.Run
		want time.Time
	}{
		{"running, with a max runtime", schemas.Run{Phase: schemas.PhaseRunning, PhaseSince: since, StartedAt: &started, Request: req(60)}, started.Add(time.Minute)},
		{"running, without", schemas.Run{Phase: schemas.PhaseRunning, PhaseSince: since, StartedAt: &started, Request: req(0)}, started.Add(10 * time.Minute)},
		{"placed, not started", schemas.Run{Phase: schemas.PhasePlaced, PhaseSince: since, Request: req(60)}, since.Add(time.Minute)},
		{"queued", schemas.Run{Phase: schemas.PhasePlaced, PhaseSince: since, Queued: true, Request: req(60)}, now.Add(time.Minute)},
		{"no start known", schemas.Run{Phase: schemas.PhasePlaced, Request: req(0)}, now.Add(10 * time.Minute)},
	} {
		tc.run.ID, tc.run.GPUs = "r-1", []string{"GPU-1"}
		b := s.booking(&tc.run, now)
		if !b.ExpectedEnd.Equal(tc.want) {
			t.Errorf("%s: expected end %s, want %s", tc.name, b.ExpectedEnd, tc.want)
		}
		if b.RunID != "r-1" || b.Resources != tc.run.Request.Resources || !slices.Equal(b.GPUs, tc.run.GPUs) || b.Want != tc.run.Request.GPU {
			t.Errorf("%s: booking %+v does not carry the Run's request", tc.name, b)
		}
	}
}

// A booking fetches while its attempt is placed or preparing: dispatched
// (its launch fetches), or queued awaiting its bytes. A queued Run that
// does not await them (its node prepares nothing ahead) fetches nothing
// until it starts, and a prepared one fetches no more.
func TestBookingFetching(t *testing.T) {
	s := &Scheduler{cfg: Config{Placement: placement.Config{UnknownRuntime: 10 * time.Minute}}}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ready := now.Add(40 * time.Second)
	for _, tc := range []struct {
		name     string
		run      schemas.Run
		fetching bool
	}{
		{"dispatched, preparing", schemas.Run{Phase: schemas.PhasePreparing}, true},
		{"queued, awaiting its bytes", schemas.Run{Phase: schemas.PhasePlaced, Queued: true, AwaitsBytes: true}, true},
		{"queued for room on a node that prepares nothing ahead", schemas.Run{Phase: schemas.PhasePlaced, Queued: true}, false},
		{"queued, its bytes prepared", schemas.Run{Phase: schemas.PhaseLaunching, Queued: true, AwaitsBytes: true}, false},
		{"running", schemas.Run{Phase: schemas.PhaseRunning}, false},
	} {
		tc.run.ID, tc.run.ReadyBy = "r-1", &ready
		if b := s.booking(&tc.run, now); b.Fetching != tc.fetching || !b.ReadyAt.Equal(ready) {
			t.Errorf("%s: fetching %v ready at %v, want %v at %v", tc.name, b.Fetching, b.ReadyAt, tc.fetching, ready)
		}
	}
}
