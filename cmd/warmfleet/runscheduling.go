package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/schemas"
)

// schedulingRows are run get's rows on who runs first: the Run's class,
// whether it may be preempted, its retry policy, why it waits, and its
// cost so far.
func schedulingRows(r schemas.Run, waitMessage string) [][2]string {
	retry := retryString(r.Retry)
	if r.Retry == nil {
		retry = "- (node loss only, up to the control plane's attempts)"
	}
	rows := [][2]string{
		{"Priority", or(r.Request.Priority, "(default class)")}, {"Preemptible", fmt.Sprint(r.Request.Preemptible)}, {"Retry", retry},
	}
	if r.Request.StartDeadlineSeconds > 0 {
		rows = append(rows, [2]string{"Start deadline", (time.Duration(r.Request.StartDeadlineSeconds) * time.Second).String()})
	}
	if q := queuedFor(r); q != "" {
		rows = append(rows, [2]string{"Queued", q})
	}
	rows = append(rows, [2]string{"Wait code", or(string(r.WaitCode), "-")})
	if waitMessage != "" {
		rows = append(rows, [2]string{"Wait message", waitMessage})
	}
	if r.Preemptions > 0 {
		rows = append(rows, [2]string{"Preemptions", fmt.Sprint(r.Preemptions)})
	}
	if r.Stopping != "" {
		rows = append(rows, [2]string{"Stopping", string(r.Stopping)})
	}
	return append(rows, [2]string{"Cost", usd(r.CostUSD)})
}

// queuedFor says what a Run booked in its node's queue waits for there
// ("" when it is not queued).
func queuedFor(r schemas.Run) string {
	switch {
	case !r.Queued:
		return ""
	case lifecycle.Fetching(r):
		msg := "its image and artifacts, on " + r.NodeID + "; it takes its cards once they are there"
		if r.ReadyBy != nil {
			msg += " (expected by " + r.ReadyBy.UTC().Format(time.RFC3339) + ")"
		}
		return msg
	}
	return "room on " + r.NodeID + "; its bytes are prepared there meanwhile"
}

// waitMessage is why a waiting Run waits, in words: the message of its
// latest decision, or of the retry it waits for ("" for a Run that does
// not wait).
func waitMessage(ctx context.Context, h history, r schemas.Run) (string, error) {
	if r.Phase != schemas.PhaseAccepted || (r.Waiting == "" && r.WaitCode == "") {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var msg string
	err := readEvents(ctx, h.events(r.ID), nil, func(ev schemas.RunEvent) {
		msg = waitNote(msg, ev)
	})
	if err != nil {
		return "", fmt.Errorf("wait message of %s: %w", r.ID, err)
	}
	return msg, nil
}

// waitNote is the wait message after ev, given msg before it: a decision
// with no node, or a requeue back to accepted (a retry's backoff follows
// a failed attempt, so the decisions before it are stale); latest wins.
func waitNote(msg string, ev schemas.RunEvent) string {
	switch {
	case ev.Decided() && ev.NodeID == "":
		return ev.Message
	case ev.Type == schemas.EventPhase && ev.Phase == schemas.PhaseAccepted && ev.From != "" && ev.From != schemas.PhaseAccepted:
		return ev.Message
	}
	return msg
}

// printAttempts writes run get's attempts: where each ran, what it held,
// how it ended and what it cost.
func printAttempts(w io.Writer, r schemas.Run, now time.Time) {
	if len(r.Attempts) == 0 {
		return
	}
	fmt.Fprintln(w)
	if hidden := r.Attempts[0].Attempt - 1; hidden > 0 {
		// Records are bounded (schemas.MaxAttemptRecords); Cost still counts these.
		fmt.Fprintf(w, "(%d earlier attempts not shown)\n", hidden)
	}
	fmt.Fprintln(w, "ATTEMPT\tNODE\tGPUS\tOUTCOME\tHELD\t$/H\tCOST")
	for _, a := range r.Attempts {
		held := "-"
		if a.HeldFrom != nil {
			end, still := now, true
			if a.EndedAt != nil {
				end, still = *a.EndedAt, false
			}
			held = end.Sub(*a.HeldFrom).Round(time.Second).String()
			if still {
				held += " (holding)"
			}
		}
		gpus := fmt.Sprint(a.GPUs)
		if a.GPUModel != "" {
			gpus += " " + a.GPUModel
		}
		outcome := string(a.Outcome)
		if outcome == "" && a.EndedAt == nil {
			outcome = "(current)"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%.2f\t%s\n", a.Attempt, or(a.NodeID, "-"), gpus, or(outcome, "-"), held, a.PricePerHour, usd(a.CostUSD))
	}
}

// usd shows an amount of money; cents hide the cost of a short attempt.
func usd(v float64) string {
	if v != 0 && v < 1 {
		return fmt.Sprintf("%.4f USD", v)
	}
	return fmt.Sprintf("%.2f USD", v)
}
