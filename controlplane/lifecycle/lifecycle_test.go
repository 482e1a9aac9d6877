package lifecycle

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

func intp(i int) *int { return &i }

// booked is a Run on node n1 in phase p, attempt 1.
func booked(p schemas.Phase) schemas.Run {
	r := schemas.Run{ID: "r-1", Phase: p, Attempt: 1, NodeID: "n1", AttemptID: schemas.WorkloadID("r-1", 1), FencingToken: 3}
	if p == schemas.PhaseAccepted {
		r.NodeID, r.AttemptID, r.Attempt = "", "", 0
	}
	return r
}

func report(phase schemas.WorkloadPhase, mut func(*schemas.WorkloadObservation)) Report {
	w := schemas.WorkloadObservation{RunID: "r-1", AttemptID: schemas.WorkloadID("r-1", 1), Phase: phase}
	if mut != nil {
		mut(&w)
	}
	return Report{NodeID: "n1", Workload: w}
}

// edgeCase is one transition that should move a Run from → to.
type edgeCase struct {
	name string
	from schemas.Phase
	prep func(*schemas.Run)
	in   Transition
	to   schemas.Phase
}

// edgeCases produces every legal move of the table through the transitions
// that make it.
func edgeCases() []edgeCase {
	var cs []edgeCase
	cancel := func(r *schemas.Run) { r.CancelRequested = true }
	cs = append(cs,
		edgeCase{"place", schemas.PhaseAccepted, nil, Placement{NodeID: "n1", FencingToken: 3}, schemas.PhasePlaced},
		edgeCase{"cancel before placement", schemas.PhaseAccepted, nil, Cancellation{Reason: "x"}, schemas.PhaseCancelled},
		edgeCase{"unsatisfiable", schemas.PhaseAccepted, nil, Unsatisfiable{Summary: "n1=insufficient_gpu;"}, schemas.PhaseFailed},
	)
	forward := map[schemas.Phase]schemas.WorkloadPhase{
		schemas.PhasePreparing: schemas.WorkloadPreparing,
		schemas.PhaseLaunching: schemas.WorkloadStarting,
		schemas.PhaseRunning:   schemas.WorkloadRunning,
	}
	for _, from := range []schemas.Phase{schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning} {
		for to, wp := range forward {
			if Rank(to) > Rank(from) {
				cs = append(cs, edgeCase{"report " + string(wp), from, nil, report(wp, nil), to})
			}
		}
		cs = append(cs,
			edgeCase{"exit 0", from, nil, report(schemas.WorkloadExited, func(w *schemas.WorkloadObservation) { w.ExitCode = intp(0) }), schemas.PhaseSucceeded},
			edgeCase{"exit 1", from, nil, report(schemas.WorkloadExited, func(w *schemas.WorkloadObservation) { w.ExitCode = intp(1) }), schemas.PhaseFailed},
			edgeCase{"exit on cancel", from, cancel, report(schemas.WorkloadExited, nil), schemas.PhaseCancelled},
			edgeCase{"receipt failed", from, nil, ReceiptFailure{NodeID: "n1", Receipt: schemas.OperationReceipt{AttemptID: schemas.WorkloadID("r-1", 1)}}, schemas.PhaseFailed},
			edgeCase{"lost, retry", from, nil, Loss{AttemptID: schemas.WorkloadID("r-1", 1), MaxAttempts: 3}, schemas.PhaseAccepted},
			edgeCase{"lost, attempts spent", from, nil, Loss{AttemptID: schemas.WorkloadID("r-1", 1), MaxAttempts: 1}, schemas.PhaseLost},
			edgeCase{"lost while cancelling", from, cancel, Loss{AttemptID: schemas.WorkloadID("r-1", 1), MaxAttempts: 3}, schemas.PhaseCancelled},
		)
	}
	return cs
}

// TestTableEveryEntry walks every (from, to) pair: the legal ones are made
// by a transition, the others are refused by the table.
func TestTableEveryEntry(t *testing.T) {
	covered := map[[2]schemas.Phase]bool{}
	for _, c := range edgeCases() {
		r := booked(c.from)
		if c.prep != nil {
			c.prep(&r)
		}
		got, evs, err := c.in.Apply(r)
		if err != nil {
			t.Errorf("%s: %s → %s: %v", c.name, c.from, c.to, err)
			continue
		}
		if got.Phase != c.to {
			t.Errorf("%s: %s → got %s, want %s", c.name, c.from, got.Phase, c.to)
			continue
		}
		if len(evs) == 0 || evs[len(evs)-1].Type != schemas.EventPhase || evs[len(evs)-1].From != c.from || evs[len(evs)-1].Phase != c.to {
			t.Errorf("%s: %s → %s: last event %+v does not describe the move", c.name, c.from, c.to, evs)
		}
		if r.Phase != c.from {
			t.Errorf("%s: Apply changed the Run it was given", c.name)
		}
		covered[[2]schemas.Phase{c.from, c.to}] = true
	}
	for _, from := range Phases {
		for _, to := range Phases {
			legal := Legal(from, to)
			err := Check(from, to)
			if legal != (err == nil) {
				t.Errorf("%s → %s: Legal %v, Check %v", from, to, legal, err)
			}
			if err != nil && !errors.Is(err, ErrIllegalTransition) {
				t.Errorf("%s → %s: %v is not ErrIllegalTransition", from, to, err)
			}
			if legal && !covered[[2]schemas.Phase{from, to}] {
				t.Errorf("%s → %s is in the table but no transition makes it", from, to)
			}
			if !legal && covered[[2]schemas.Phase{from, to}] {
				t.Errorf("%s → %s was made though the table forbids it", from, to)
			}
			switch {
			case from.Terminal() && legal:
				t.Errorf("%s → %s: a way out of a terminal phase", from, to)
			case to == schemas.PhaseAccepted && legal != (from != schemas.PhaseAccepted && !from.Terminal()):
				t.Errorf("%s → accepted: legal=%v; only a booked attempt goes back", from, legal)
			case to != schemas.PhaseAccepted && !to.Terminal() && Rank(to) <= Rank(from) && legal:
				t.Errorf("%s → %s is backwards but legal", from, to)
			}
		}
	}
	if Legal(schemas.PhaseAccepted, schemas.PhaseRunning) {
		t.Error("accepted → running without a booking")
	}
}

// TestIllegalMovesRefused drives transitions at Runs whose phase the table
// forbids them to leave that way.
func TestIllegalMovesRefused(t *testing.T) {
	// A report for an accepted Run with a matching attempt would skip placement.
	r := booked(schemas.PhaseAccepted)
	r.NodeID, r.AttemptID = "n1", schemas.WorkloadID("r-1", 1)
	if _, _, err := report(schemas.WorkloadRunning, nil).Apply(r); !errors.Is(err, ErrIllegalTransition) {
		t.Errorf("running report on an accepted Run: %v, want ErrIllegalTransition", err)
	}
	for _, p := range []schemas.Phase{schemas.PhaseSucceeded, schemas.PhaseFailed, schemas.PhaseCancelled, schemas.PhaseLost} {
		for _, in := range []Transition{
			Placement{NodeID: "n1"}, Wait{Summary: "s"}, Unsatisfiable{}, QueueStart{AttemptID: schemas.WorkloadID("r-1", 1)},
			Restamp{AttemptID: schemas.WorkloadID("r-1", 1)}, report(schemas.WorkloadRunning, nil),
			ReceiptFailure{NodeID: "n1", Receipt: schemas.OperationReceipt{AttemptID: schemas.WorkloadID("r-1", 1)}},
			Loss{AttemptID: schemas.WorkloadID("r-1", 1), MaxAttempts: 3}, Cancellation{},
		} {
			got, evs, err := in.Apply(booked(p))
			if !errors.Is(err, ErrNoChange) || got.Phase != p || len(evs) != 0 {
				t.Errorf("%T on %s: phase %s, %d events, %v; want no change", in, p, got.Phase, len(evs), err)
			}
		}
	}
}

func TestReport(t *testing.T) {
	running := booked(schemas.PhaseRunning)
	if _, _, err := report(schemas.WorkloadPreparing, nil).Apply(running); !errors.Is(err, ErrStaleReport) || !errors.Is(err, ErrNoChange) {
		t.Errorf("preparing after running: %v, want ErrStaleReport", err)
	}
	other := report(schemas.WorkloadRunning, func(w *schemas.WorkloadObservation) { w.AttemptID = "r-1-a0" })
	if _, _, err := other.Apply(running); !errors.Is(err, ErrSuperseded) {
		t.Errorf("a running superseded attempt: %v, want ErrSuperseded", err)
	}
	ended := report(schemas.WorkloadExited, func(w *schemas.WorkloadObservation) { w.AttemptID = "r-1-a0" })
	if _, _, err := ended.Apply(running); !errors.Is(err, ErrNoChange) || errors.Is(err, ErrSuperseded) {
		t.Errorf("an exited superseded attempt: %v, want plain ErrNoChange", err)
	}
	elsewhere := report(schemas.WorkloadRunning, nil)
	elsewhere.NodeID = "n2"
	if _, _, err := elsewhere.Apply(booked(schemas.PhaseLaunching)); !errors.Is(err, ErrNotBookedHere) || !errors.Is(err, ErrNoChange) {
		t.Errorf("same attempt id from another node: %v, want ErrNotBookedHere", err)
	}

	started, finished := time.Unix(100, 0), time.Unix(200, 0)
	exit := report(schemas.WorkloadExited, func(w *schemas.WorkloadObservation) {
		w.ExitCode, w.OOMKilled, w.StartedAt, w.FinishedAt = intp(137), true, &started, &finished
		w.ObservedAt = finished
	})
	got, evs, err := exit.Apply(booked(schemas.PhasePlaced))
	if err != nil || got.Phase != schemas.PhaseFailed || got.Reason != string(schemas.CodeOOMKilled) || !got.OOMKilled ||
		*got.ExitCode != 137 || !got.StartedAt.Equal(started) || !got.FinishedAt.Equal(finished) {
		t.Fatalf("oom exit: %+v %v", got, err)
	}
	if ev := evs[0]; ev.Code != schemas.CodeOOMKilled || ev.ObservedAt == nil || !ev.ObservedAt.Equal(finished) || *ev.ExitCode != 137 {
		t.Errorf("oom event %+v", ev)
	}
	for _, c := range []struct {
		w    func(*schemas.WorkloadObservation)
		want schemas.Code
	}{
		{func(w *schemas.WorkloadObservation) { w.StopReason = string(schemas.CodeMaxRuntime) }, schemas.CodeMaxRuntime},
		{func(w *schemas.WorkloadObservation) {
			w.Phase = schemas.WorkloadFailed
			w.FailureReason = "no such binary"
		}, schemas.CodeLaunchFailed},
	} {
		got, _, err := report(schemas.WorkloadExited, c.w).Apply(booked(schemas.PhaseRunning))
		if err != nil || got.Phase != schemas.PhaseFailed || got.Reason != string(c.want) {
			t.Errorf("want %s: %s %s %v", c.want, got.Phase, got.Reason, err)
		}
	}
	cancelling := booked(schemas.PhaseLaunching)
	cancelling.CancelRequested = true
	if got, _, _ := report(schemas.WorkloadFailed, nil).Apply(cancelling); got.Phase != schemas.PhaseCancelled {
		t.Errorf("failed start while cancelling: %s, want cancelled", got.Phase)
	}
}

func TestProgress(t *testing.T) {
	prog := func(done int64) Report {
		return report(schemas.WorkloadPreparing, func(w *schemas.WorkloadObservation) {
			w.Progress = &schemas.TransferProgress{DoneBytes: done, TotalBytes: 100}
		})
	}
	got, evs, err := prog(10).Apply(booked(schemas.PhasePreparing))
	if err != nil || got.Progress == nil || got.Progress.DoneBytes != 10 || len(evs) != 1 || evs[0].Type != schemas.EventProgress {
		t.Fatalf("progress: %+v %+v %v", got.Progress, evs, err)
	}
	if _, _, err := prog(10).Apply(got); !errors.Is(err, ErrNoChange) {
		t.Errorf("the same counts again: %v, want no change", err)
	}
	if _, _, err := prog(20).Apply(booked(schemas.PhaseLaunching)); !errors.Is(err, ErrNoChange) {
		t.Errorf("progress after preparing: %v, want no change", err)
	}
	// Leaving preparing clears the progress.
	next, _, err := report(schemas.WorkloadStarting, nil).Apply(got)
	if err != nil || next.Progress != nil {
		t.Errorf("launching kept progress %+v (%v)", next.Progress, err)
	}
}

// An artifact's fetch and a Run that mounts artifacts are told as such,
// not as an image's.
func TestProgressNamesTheArtifact(t *testing.T) {
	withArtifacts := func(r schemas.Run, names ...string) schemas.Run {
		for _, n := range names {
			r.Artifacts = append(r.Artifacts, schemas.ArtifactMount{Name: n})
		}
		return r
	}
	art := report(schemas.WorkloadPreparing, func(w *schemas.WorkloadObservation) {
		w.Progress = &schemas.TransferProgress{DoneBytes: 1 << 20, TotalBytes: 4 << 20, Artifact: "weights"}
	})
	got, evs, err := art.Apply(withArtifacts(booked(schemas.PhasePreparing), "weights"))
	if err != nil || len(evs) != 1 || evs[0].Message != "artifact weights transfer 1.0 MiB of 4.0 MiB (25%)" ||
		evs[0].Progress.Artifact != "weights" || got.Progress.Artifact != "weights" {
		t.Fatalf("artifact progress: %+v %v", evs, err)
	}
	img := report(schemas.WorkloadPreparing, func(w *schemas.WorkloadObservation) {
		w.Progress = &schemas.TransferProgress{DoneBytes: 1 << 20, TotalBytes: 4 << 20}
	})
	if _, evs, _ := img.Apply(got); len(evs) != 1 || evs[0].Message != "image transfer 1.0 MiB of 4.0 MiB (25%)" {
		t.Errorf("image progress after an artifact's: %+v", evs)
	}

	for _, tc := range []struct {
		names              []string
		preparing, started string
	}{
		{nil, "node is preparing the image", "image ready; starting the container"},
		{[]string{"weights"}, "node is preparing the image and artifact weights", "image and artifact weights ready; starting the container"},
		{[]string{"a", "b"}, "node is preparing the image and 2 artifacts", "image and 2 artifacts ready; starting the container"},
	} {
		r := withArtifacts(booked(schemas.PhasePlaced), tc.names...)
		prep, evs, err := report(schemas.WorkloadPreparing, nil).Apply(r)
		if err != nil || len(evs) != 1 || evs[0].Message != tc.preparing {
			t.Errorf("%v preparing: %+v %v, want %q", tc.names, evs, err, tc.preparing)
		}
		if _, evs, err := report(schemas.WorkloadPrepared, nil).Apply(prep); err != nil || len(evs) != 1 || evs[0].Message != tc.started {
			t.Errorf("%v prepared: %+v %v, want %q", tc.names, evs, err, tc.started)
		}
	}
}

func TestPlacementAndQueue(t *testing.T) {
	got, evs, err := Placement{NodeID: "n1", FencingToken: 7, Generation: 2, Queued: true}.Apply(schemas.Run{ID: "r-1", Phase: schemas.PhaseAccepted, Attempt: 1, Waiting: "x"})
	if err != nil || got.Attempt != 2 || got.AttemptID != "r-1-a2" || got.FencingToken != 7 || got.Generation != 2 || !got.Queued || got.Waiting != "" {
		t.Fatalf("placement: %+v %v", got, err)
	}
	if len(evs) != 2 || evs[0].Type != schemas.EventDecided || evs[0].Decision == nil || evs[1].Message != "booked on n1, queued behind its running work; prefetching the image" {
		t.Errorf("placement events %+v", evs)
	}
	if _, _, err := (QueueStart{AttemptID: "r-1-a1"}).Apply(got); !errors.Is(err, ErrNoChange) {
		t.Errorf("queue start for another attempt: %v", err)
	}
	started, evs, err := QueueStart{AttemptID: "r-1-a2"}.Apply(got)
	if err != nil || started.Queued || len(evs) != 1 || evs[0].Type != schemas.EventNote {
		t.Errorf("queue start: %+v %+v %v", started, evs, err)
	}
	if _, _, err := (QueueStart{AttemptID: "r-1-a2"}).Apply(started); !errors.Is(err, ErrNoChange) {
		t.Errorf("queue start twice: %v", err)
	}
	re, evs, err := Restamp{AttemptID: "r-1-a2", FencingToken: 9, Generation: 3}.Apply(started)
	if err != nil || re.FencingToken != 9 || re.Generation != 3 || len(evs) != 0 {
		t.Errorf("restamp: %+v %v", re, err)
	}
}

func TestWait(t *testing.T) {
	w := Wait{Summary: "n1=insufficient_gpu;", Code: schemas.CodeNoCapacity, Message: "no node fits now; waiting"}
	got, evs, err := w.Apply(booked(schemas.PhaseAccepted))
	if err != nil || got.Waiting != w.Summary || len(evs) != 1 || evs[0].Code != schemas.CodeNoCapacity {
		t.Fatalf("wait: %+v %+v %v", got, evs, err)
	}
	if _, _, err := w.Apply(got); !errors.Is(err, ErrNoChange) {
		t.Errorf("the same answer recorded twice: %v", err)
	}
	if _, _, err := w.Apply(booked(schemas.PhasePlaced)); !errors.Is(err, ErrNoChange) {
		t.Errorf("wait on a placed Run: %v", err)
	}
	failed, evs, err := Unsatisfiable{Summary: w.Summary}.Apply(got)
	if err != nil || failed.Phase != schemas.PhaseFailed || failed.Reason != string(schemas.CodeUnsatisfiable) || len(evs) != 2 {
		t.Errorf("unsatisfiable after waiting the same answer: %+v %v", failed, err)
	}
}

func TestLossAndCancel(t *testing.T) {
	r := booked(schemas.PhaseRunning)
	got, evs, err := Loss{AttemptID: r.AttemptID, Why: "node n1 stopped heartbeating", MaxAttempts: 3}.Apply(r)
	if err != nil || got.Phase != schemas.PhaseAccepted || got.NodeID != "" || got.Reason != string(schemas.CodeNodeLost) {
		t.Fatalf("loss: %+v %v", got, err)
	}
	if evs[0].NodeID != "n1" || evs[0].Code != schemas.CodeNodeLost || !strings.Contains(evs[0].Message, "attempt 1 on n1: node n1 stopped heartbeating; retry 1 of 2") {
		t.Errorf("the loss event must name the node it was lost on: %+v", evs[0])
	}
	if _, _, err := (Loss{AttemptID: "r-1-a0", MaxAttempts: 3}).Apply(r); !errors.Is(err, ErrNoChange) {
		t.Errorf("loss of an old attempt: %v", err)
	}
	if _, _, err := (Loss{AttemptID: r.AttemptID, MaxAttempts: 3}).Apply(got); !errors.Is(err, ErrNoChange) {
		t.Errorf("loss twice: %v", err)
	}

	c, evs, err := Cancellation{Reason: "user"}.Apply(booked(schemas.PhaseRunning))
	if err != nil || !c.CancelRequested || c.GraceSeconds != schemas.DefaultGraceSeconds || c.Phase != schemas.PhaseRunning || len(evs) != 1 {
		t.Fatalf("cancel a running Run: %+v %v", c, err)
	}
	if _, _, err := (Cancellation{}).Apply(c); !errors.Is(err, ErrNoChange) {
		t.Errorf("cancel twice: %v", err)
	}
	if c, _, _ := (Cancellation{GraceSeconds: 3}).Apply(booked(schemas.PhasePlaced)); c.GraceSeconds != 3 {
		t.Errorf("grace %d, want 3", c.GraceSeconds)
	}
}

func TestDue(t *testing.T) {
	now := time.Unix(1000, 0)
	tm := Timing{RedispatchAfter: 30 * time.Second, MaxRuntimeSlack: 10 * time.Second}
	at := func(p schemas.Phase, since time.Duration, mut func(*schemas.Run)) schemas.Run {
		r := booked(p)
		r.PhaseSince = now.Add(-since)
		if mut != nil {
			mut(&r)
		}
		return r
	}
	queued := func(r *schemas.Run) { r.Queued = true }
	awaits := func(r *schemas.Run) { r.Queued, r.AwaitsBytes = true, true }
	cancel := func(r *schemas.Run) { r.CancelRequested = true }
	max60 := func(r *schemas.Run) { r.Request.MaxRuntimeSeconds = 60 }
	for _, c := range []struct {
		name  string
		r     schemas.Run
		token uint64
		want  Step
	}{
		{"accepted", at(schemas.PhaseAccepted, time.Hour, nil), 0, StepPlace},
		{"queued", at(schemas.PhasePlaced, time.Hour, queued), 3, StepStartQueued},
		{"queued, node re-enrolled", at(schemas.PhasePreparing, 0, queued), 9, StepStartQueued},
		{"queued and cancelling, fresh", at(schemas.PhasePlaced, time.Second, func(r *schemas.Run) { queued(r); cancel(r) }), 3, StepNone},
		{"awaiting its bytes, fresh", at(schemas.PhasePreparing, time.Second, awaits), 3, StepStartQueued},
		{"awaiting its bytes, stale", at(schemas.PhasePlaced, time.Minute, awaits), 3, StepResend},
		{"awaiting its bytes, node re-enrolled", at(schemas.PhasePreparing, 0, awaits), 9, StepResend},
		{"awaiting its bytes, prepared long ago", at(schemas.PhaseLaunching, time.Hour, awaits), 9, StepStartQueued},
		{"cancelling, stale", at(schemas.PhaseRunning, time.Minute, cancel), 3, StepStop},
		{"cancelling, node re-enrolled", at(schemas.PhaseRunning, time.Second, cancel), 9, StepNone},
		{"dispatched, fresh", at(schemas.PhasePreparing, time.Second, nil), 3, StepNone},
		{"dispatched, stale", at(schemas.PhaseLaunching, time.Minute, nil), 3, StepResend},
		{"dispatched, node re-enrolled", at(schemas.PhasePlaced, 0, nil), 4, StepResend},
		{"running long, no limit", at(schemas.PhaseRunning, time.Hour, nil), 3, StepNone},
		{"running, node re-enrolled", at(schemas.PhaseRunning, 0, nil), 4, StepResend},
		{"running within limit and slack", at(schemas.PhaseRunning, 65*time.Second, max60), 3, StepNone},
		{"running past limit and slack", at(schemas.PhaseRunning, 71*time.Second, max60), 3, StepStopOverdue},
		{"ended", at(schemas.PhaseSucceeded, time.Hour, nil), 9, StepNone},
	} {
		if got := Due(c.r, c.token, now, tm); got != c.want {
			t.Errorf("%s (stage %s): %q, want %q", c.name, StageOf(c.r), got, c.want)
		}
	}
}

// TestReportedGPUsWin: after a restart, a node's account of the cards an
// attempt holds replaces the booking's when they differ, even in a report
// of a phase the Run has passed; an equal or empty account changes nothing.
func TestReportedGPUsWin(t *testing.T) {
	r := booked(schemas.PhaseRunning)
	r.GPUs = []string{"GPU-a"}
	held := report(schemas.WorkloadRunning, func(w *schemas.WorkloadObservation) { w.GPUs = []string{"GPU-b"} })
	got, evs, err := held.Apply(r)
	if err != nil || len(got.GPUs) != 1 || got.GPUs[0] != "GPU-b" || got.Phase != schemas.PhaseRunning || len(evs) != 1 || evs[0].GPUs[0] != "GPU-b" {
		t.Fatalf("node reports GPU-b for a booking of GPU-a: %+v %+v %v", got.GPUs, evs, err)
	}
	if _, _, err := held.Apply(got); !errors.Is(err, ErrStaleReport) {
		t.Errorf("the same account again: %v, want a stale report", err)
	}
	if _, _, err := report(schemas.WorkloadRunning, nil).Apply(got); !errors.Is(err, ErrStaleReport) {
		t.Errorf("a report naming no cards: %v, want a stale report", err)
	}
	lost, _, err := Loss{AttemptID: got.AttemptID, MaxAttempts: 3}.Apply(got)
	if err != nil || lost.GPUs != nil {
		t.Errorf("a lost attempt still holds %v (%v): its cards are free for the next one", lost.GPUs, err)
	}
}

// TestRunFaultIsTerminal: a registry that refused the pull, or an image
// without the Run's platform, ends the Run failed with that code, whether
// the node said so in a receipt or in a workload report, and the Run is not
// sent to another node. Other failures keep launch_failed.
func TestRunFaultIsTerminal(t *testing.T) {
	cases := []struct {
		name string
		tr   Transition
		want schemas.Code
	}{
		{"receipt", ReceiptFailure{NodeID: "n1", Receipt: schemas.OperationReceipt{AttemptID: schemas.WorkloadID("r-1", 1), Kind: schemas.CmdPrepareImage,
			Outcome: schemas.OutcomeFailed, Code: schemas.CodeRegistryAuthFailed, Message: "registry 127.0.0.1:5000 refused"}}, schemas.CodeRegistryAuthFailed},
		{"report", report(schemas.WorkloadFailed, func(w *schemas.WorkloadObservation) {
			w.FailureCode, w.FailureReason = schemas.CodeRegistryAuthFailed, "registry 127.0.0.1:5000 refused"
		}), schemas.CodeRegistryAuthFailed},
		{"platform receipt", ReceiptFailure{NodeID: "n1", Receipt: schemas.OperationReceipt{AttemptID: schemas.WorkloadID("r-1", 1), Kind: schemas.CmdPrepareImage,
			Outcome: schemas.OutcomeFailed, Code: schemas.CodePlatformNotInImage, Message: "index has builds for linux/arm64"}}, schemas.CodePlatformNotInImage},
		{"secret receipt", ReceiptFailure{NodeID: "n1", Receipt: schemas.OperationReceipt{AttemptID: schemas.WorkloadID("r-1", 1), Kind: schemas.CmdLaunchWorkload,
			Outcome: schemas.OutcomeFailed, Code: schemas.CodeSecretUnavailable, Message: "the control plane gave no secrets"}}, schemas.CodeSecretUnavailable},
		{"uncoded receipt", ReceiptFailure{NodeID: "n1", Receipt: schemas.OperationReceipt{AttemptID: schemas.WorkloadID("r-1", 1), Outcome: schemas.OutcomeFailed}}, schemas.CodeLaunchFailed},
		{"other receipt", ReceiptFailure{NodeID: "n1", Receipt: schemas.OperationReceipt{AttemptID: schemas.WorkloadID("r-1", 1), Code: schemas.CodeInvalidCache}}, schemas.CodeLaunchFailed},
		{"other report", report(schemas.WorkloadFailed, func(w *schemas.WorkloadObservation) { w.FailureCode = schemas.CodeOOMKilled }), schemas.CodeLaunchFailed},
	}
	for _, c := range cases {
		for _, from := range []schemas.Phase{schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching} {
			r, evs, err := c.tr.Apply(booked(from))
			if err != nil {
				t.Fatalf("%s from %s: %v", c.name, from, err)
			}
			if r.Phase != schemas.PhaseFailed || r.Reason != string(c.want) {
				t.Fatalf("%s from %s: phase %s reason %q, want failed %q", c.name, from, r.Phase, r.Reason, c.want)
			}
			if len(evs) != 1 || evs[0].Code != c.want {
				t.Fatalf("%s from %s: events %+v, want one coded %q", c.name, from, evs, c.want)
			}
		}
	}
}

// TestNotBookedHere: a receipt or a report naming the Run's current attempt
// from another node than it is booked on changes nothing, in every phase the
// attempt can be in, whatever it says; from the booked node it applies.
func TestNotBookedHere(t *testing.T) {
	fail := schemas.OperationReceipt{AttemptID: schemas.WorkloadID("r-1", 1), Kind: schemas.CmdLaunchWorkload, Outcome: schemas.OutcomeFailed, Code: schemas.CodeLaunchFailed}
	exited := func(w *schemas.WorkloadObservation) { w.ExitCode = intp(3) }
	for _, from := range []schemas.Phase{schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning} {
		for _, in := range []Transition{
			ReceiptFailure{NodeID: "n2", Receipt: fail},
			ReceiptFailure{Receipt: fail},
			Report{NodeID: "n2", Workload: report(schemas.WorkloadExited, exited).Workload},
			Report{NodeID: "n2", Workload: report(schemas.WorkloadFailed, nil).Workload},
			Report{NodeID: "n2", Workload: report(schemas.WorkloadRunning, nil).Workload},
		} {
			r := booked(from)
			got, evs, err := in.Apply(r)
			if !errors.Is(err, ErrNotBookedHere) || got.Phase != from || len(evs) != 0 || got.Reason != "" || got.ExitCode != nil {
				t.Errorf("%#v on %s: phase %s, %d events, %v; want ErrNotBookedHere and no change", in, from, got.Phase, len(evs), err)
			}
		}
		if got, _, err := (ReceiptFailure{NodeID: "n1", Receipt: fail}).Apply(booked(from)); err != nil || got.Phase != schemas.PhaseFailed {
			t.Errorf("receipt from the booked node on %s: %s, %v; want failed", from, got.Phase, err)
		}
	}
	// An attempt lost and booked nowhere: a late word from its node is not
	// refused as an intrusion, and moves nothing; one that says it still
	// runs is superseded (stopped there).
	lost, _, err := Loss{AttemptID: schemas.WorkloadID("r-1", 1), MaxAttempts: 3}.Apply(booked(schemas.PhaseRunning))
	if err != nil || lost.Phase != schemas.PhaseAccepted || lost.NodeID != "" {
		t.Fatalf("loss: %+v %v", lost, err)
	}
	for _, in := range []Transition{ReceiptFailure{NodeID: "n1", Receipt: fail}, report(schemas.WorkloadExited, exited)} {
		if got, evs, err := in.Apply(lost); !errors.Is(err, ErrNoChange) || errors.Is(err, ErrNotBookedHere) || got.Phase != schemas.PhaseAccepted || len(evs) != 0 {
			t.Errorf("%#v on a lost attempt: %s, %v; want plain no change", in, got.Phase, err)
		}
	}
	if _, _, err := report(schemas.WorkloadRunning, nil).Apply(lost); !errors.Is(err, ErrSuperseded) {
		t.Errorf("a lost attempt still running: %v, want ErrSuperseded", err)
	}
}

// TestReceiptMessageBounded: a failed receipt's message enters the
// attempt's event cut to schemas.MaxReceiptMessageBytes, marked.
func TestReceiptMessageBounded(t *testing.T) {
	msg := strings.Repeat("m", schemas.MaxStringBytes)
	_, evs, err := ReceiptFailure{NodeID: "n1", Receipt: schemas.OperationReceipt{AttemptID: schemas.WorkloadID("r-1", 1), Kind: schemas.CmdPrepareImage,
		Outcome: schemas.OutcomeFailed, Message: msg}}.Apply(booked(schemas.PhasePreparing))
	if err != nil || len(evs) != 1 {
		t.Fatalf("%v %+v", err, evs)
	}
	if m := evs[0].Message; len(m) > schemas.MaxReceiptMessageBytes+64 || !strings.Contains(m, " bytes cut]") {
		t.Errorf("event message of %d bytes (%q…), want at most %d of the receipt's, marked", len(m), m[:40], schemas.MaxReceiptMessageBytes)
	}
}
