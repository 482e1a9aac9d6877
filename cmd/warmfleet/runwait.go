package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/runlog"
	"github.com/warmfleet/warmfleet/schemas"
)

// exitNoRunCode is `run submit`'s exit status when warmfleet failed, or
// when the Run ended without an exit code of its own: 125, as docker
// run's.
const exitNoRunCode = 125

// exitStatus ends a command with a status of its own: main prints err,
// when there is one, and exits with code.
type exitStatus struct {
	code int
	err  error // nil: nothing more to say (the Run's own exit code)
}

func (e *exitStatus) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitStatus) Unwrap() error { return e.err }

// lockedWriter serialises writes from the goroutines that share a stream.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// endsWait reports whether ev is the last event `run submit --wait`
// follows: the Run's terminal phase, or the refusal of the submit.
func endsWait(ev schemas.RunEvent) bool {
	return terminal(ev) || ev.Type == schemas.EventRejected
}

// attachRun follows Run runID until it ends: its output through p as it
// arrives in WF_LOGS (read as `run logs -f` reads it), warmfleet's
// progress lines to progress. The last line, once the output is all
// printed, is how the Run ended; the error is the exit status that
// follows from it (runOutcome).
func attachRun(parent context.Context, h history, runID string, p *logPrinter, progress io.Writer) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	ended := make(chan struct{})
	logsDone := make(chan error, 1)
	go func() {
		err := runlog.ReadFrom(ctx, h.logs(runID), runlog.Options{Follow: true, Done: ended, Invalid: skipNotice(progress), Gaps: gapNotice(progress, runID)}, p.line)
		if err != nil {
			cancel() // stop following events too
		}
		logsDone <- err
	}()
	var end schemas.RunEvent
	evErr := readEvents(ctx, h.events(runID), endsWait, func(ev schemas.RunEvent) {
		if endsWait(ev) {
			end = ev
		} else if l := runProgressLine(ev); l != "" {
			fmt.Fprintln(progress, "warmfleet: "+l)
		}
	})
	close(ended) // the log reader prints what WF_LOGS holds now, then returns
	logErr := <-logsDone
	switch {
	case parent.Err() != nil:
		return stoppedFollowing(runID, parent.Err())
	case logErr != nil:
		return stoppedFollowing(runID, fmt.Errorf("reading its output: %w", logErr))
	case evErr != nil:
		return stoppedFollowing(runID, evErr)
	}
	outcome := runOutcome(runID, end)
	var st *exitStatus
	if !errors.As(outcome, &st) || st.err == nil {
		if p.midLineTo(progress) {
			fmt.Fprintln(progress) // the Run's last line had no newline
		}
		fmt.Fprintln(progress, "warmfleet: "+runProgressLine(end))
	}
	return outcome
}

// followEvents is `run submit --wait --quiet`: the Run's events on stdout
// until it ends, then runOutcome.
func followEvents(ctx context.Context, w io.Writer, g *globals, conn *bus.Conn, runID string) error {
	var end schemas.RunEvent
	err := readEvents(ctx, g.history(conn).events(runID), endsWait, func(ev schemas.RunEvent) {
		end = ev
		printEvent(w, g, ev)
	})
	if err != nil {
		return stoppedFollowing(runID, err)
	}
	return runOutcome(runID, end)
}

func stoppedFollowing(runID string, err error) error {
	return fmt.Errorf("stopped following run %s (it goes on; `warmfleet run cancel %s` stops it): %w", runID, runID, err)
}

// runOutcome is the exit status of `run submit --wait` for a Run whose
// last event is end: nil when it succeeded, its exit code when it has a
// non-zero one of its own, else exitNoRunCode with why.
func runOutcome(runID string, end schemas.RunEvent) error {
	switch {
	case end.Type == schemas.EventPhase && end.Phase == schemas.PhaseSucceeded:
		return nil
	case end.Type == schemas.EventRejected:
		return &exitStatus{code: exitNoRunCode, err: fmt.Errorf("run %s rejected (%s): %s", runID, end.Code, fieldMessage(end))}
	case end.ExitCode != nil && *end.ExitCode > 0 && *end.ExitCode < 256:
		return &exitStatus{code: *end.ExitCode}
	}
	return &exitStatus{code: exitNoRunCode, err: fmt.Errorf("run %s ended %s without an exit code of its own: %s", runID, phaseAndCode(end), fieldMessage(end))}
}

// runProgressLine is one of warmfleet's progress lines for ev, e.g.
// "preparing: image transfer 12.0 MiB of 48.0 MiB (25%)"; "" for events
// that say nothing a person follows (a booking's decision: the placed
// event that follows says where).
func runProgressLine(ev schemas.RunEvent) string {
	msg := fieldMessage(ev)
	if ev.Type == schemas.EventCancel {
		return strings.TrimSuffix("cancel requested: "+msg, ": ")
	}
	if msg == "" {
		return ""
	}
	if ev.ExitCode != nil {
		msg += fmt.Sprintf(" (exit %d)", *ev.ExitCode)
	}
	return phaseAndCode(ev) + ": " + msg
}

func phaseAndCode(ev schemas.RunEvent) string {
	if ev.Code == "" {
		return string(ev.Phase)
	}
	return fmt.Sprintf("%s (%s)", ev.Phase, ev.Code)
}

func fieldMessage(ev schemas.RunEvent) string {
	if ev.Field != "" {
		return ev.Field + ": " + ev.Message
	}
	return ev.Message
}

// skipNotice tells w of each WF_LOGS message that is not a chunk.
func skipNotice(w io.Writer) func(seq uint64, err error) {
	return func(seq uint64, err error) {
		fmt.Fprintf(w, "warmfleet: skipped %s message %d: %v\n", bus.StreamLogs, seq, err)
	}
}
