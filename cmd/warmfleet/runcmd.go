package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/runlog"
	"github.com/warmfleet/warmfleet/schemas"
)

func newRunCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "run", Short: "Submit, inspect and cancel Runs"}
	cmd.AddCommand(newRunSubmit(g), newRunGet(g), newRunList(g), newRunEvents(g), newRunLogs(g), newRunCancel(g), newRunDecision(g))
	return cmd
}

func printEvent(w io.Writer, g *globals, ev schemas.RunEvent) {
	if g.output == "json" {
		b, _ := json.Marshal(ev)
		fmt.Fprintln(w, string(b))
		return
	}
	detail := fieldMessage(ev)
	if ev.ExitCode != nil {
		detail += fmt.Sprintf(" (exit %d)", *ev.ExitCode)
	}
	fmt.Fprintf(w, "%-4d %s  %-16s %-10s %-12s %-22s %s\n", ev.Seq, ev.At.UTC().Format("15:04:05.000"), ev.Type, ev.Phase, or(ev.NodeID, "-"), or(string(ev.Code), "-"), detail)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func getRun(ctx context.Context, conn *bus.Conn, id string) (schemas.Run, error) {
	kv, err := conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		return schemas.Run{}, err
	}
	var r schemas.Run
	if _, err := bus.GetJSON(ctx, kv, id, &r); err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return r, fmt.Errorf("no run %s (runs are named r-…; `warmfleet run list` shows them)", id)
		}
		return r, err
	}
	r.Outbox = nil
	return r, nil
}

func newRunGet(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "get RUN_ID", Short: "Show one Run", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			h := g.history(conn)
			r, err := h.run(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			// A failed or lost Run shows its last lines.
			last, lastErr := lastLines(cmd.Context(), h, r)
			wait, waitErr := waitMessage(cmd.Context(), h, r)
			if waitErr != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "warmfleet: %v\n", waitErr)
			}
			v := struct {
				schemas.Run
				WaitMessage string        `json:"wait_message,omitempty"`
				LastLines   []runlog.Line `json:"last_lines,omitempty"`
			}{r, wait, last}
			err = g.render(cmd.OutOrStdout(), v, func(tw *tabwriter.Writer) {
				exit := "-"
				if r.ExitCode != nil {
					exit = fmt.Sprint(*r.ExitCode)
				}
				for _, row := range [][2]string{
					{"ID", r.ID}, {"Tenant", r.TenantOf()}, {"Submitted by", or(r.SubmittedBy, "-")}, {"Request", r.Request.RequestID}, {"Image", r.Request.Image}, {"Phase", string(r.Phase)},
					{"Reason", or(r.Reason, "-")}, {"Node", or(r.NodeID, "-")}, {"Attempt", fmt.Sprint(r.Attempt)},
					{"Exit code", exit}, {"OOM killed", fmt.Sprint(r.OOMKilled)}, {"Started", fmtTime(r.StartedAt)},
					{"Finished", fmtTime(r.FinishedAt)}, {"Created", fmtTime(&r.CreatedAt)}, {"Waiting", or(r.Waiting, "-")},
					{"Progress", progressOf(r)}, {"Execution", executionOf(r)},
				} {
					fmt.Fprintf(tw, "%s:\t%s\n", row[0], row[1])
				}
				for _, row := range schedulingRows(r, wait) {
					fmt.Fprintf(tw, "%s:\t%s\n", row[0], row[1])
				}
				printAttempts(tw, r, time.Now())
			})
			if err == nil && g.output == "json" && lastErr != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "warmfleet: %v\n", lastErr)
			}
			if err != nil || g.output == "json" {
				return err
			}
			return printLastLines(cmd.OutOrStdout(), last, lastErr)
		},
	}
}

func newRunList(g *globals) *cobra.Command {
	var phase string
	cmd := &cobra.Command{
		Use: "list", Short: "List Runs, newest first",
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			runs, leftOff, err := g.history(conn).runs(cmd.Context(), phase)
			if err != nil {
				return err
			}
			if leftOff > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "warmfleet: %d more Runs left off (the newest %d shown)\n", leftOff, len(runs))
			}
			return g.render(cmd.OutOrStdout(), runs, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "RUN\tTENANT\tREQUEST\tPHASE\tNODE\tEXIT\tREASON\tCREATED")
				for _, r := range runs {
					exit := "-"
					if r.ExitCode != nil {
						exit = fmt.Sprint(*r.ExitCode)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.TenantOf(), r.Request.RequestID, r.Phase, or(r.NodeID, "-"), exit, or(r.Reason, "-"), fmtTime(&r.CreatedAt))
				}
			})
		},
	}
	cmd.Flags().StringVar(&phase, "phase", "", "only Runs in this phase")
	return cmd
}

func listRuns(ctx context.Context, conn *bus.Conn) ([]schemas.Run, error) {
	runs, err := listJSON[schemas.Run](ctx, conn, bus.BucketRuns)
	if err != nil {
		return nil, err
	}
	for i := range runs {
		runs[i].Outbox = nil
	}
	slices.SortFunc(runs, func(a, b schemas.Run) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return runs, nil
}

func newRunEvents(g *globals) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use: "events RUN_ID", Short: "Print a Run's events in order", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			if g.output != "json" {
				fmt.Fprintf(cmd.OutOrStdout(), "%-4s %-12s  %-16s %-10s %-12s %-22s %s\n", "SEQ", "AT", "TYPE", "PHASE", "NODE", "CODE", "DETAIL")
			}
			var until func(schemas.RunEvent) bool
			if follow {
				until = terminal
			}
			return readEvents(cmd.Context(), g.history(conn).events(args[0]), until, func(ev schemas.RunEvent) { printEvent(cmd.OutOrStdout(), g, ev) })
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep reading until the Run ends")
	return cmd
}

func newRunCancel(g *globals) *cobra.Command {
	var grace int64
	var reason string
	cmd := &cobra.Command{
		Use: "cancel RUN_ID", Short: "Stop a Run: SIGTERM, grace period, SIGKILL", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := schemas.CancelRun{RunID: args[0], GraceSeconds: grace, Reason: reason}
			if err := c.Validate(g.tenant); err != nil {
				return err
			}
			if err := schemas.ValidateTenant("--tenant", g.tenant); err != nil {
				return err
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			b, _ := json.Marshal(c)
			m := &nats.Msg{Subject: bus.CancelSubject(g.tenant, g.identity()), Data: b}
			if err := publishIntake(cmd.Context(), g, conn, m, ""); err != nil {
				return fmt.Errorf("cancel: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cancel of %s requested\n", c.RunID)
			return nil
		},
	}
	cmd.Flags().Int64Var(&grace, "grace", 0, "seconds between SIGTERM and SIGKILL (default 10)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded in the Run's events")
	return cmd
}

func newRunDecision(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "decision RUN_ID", Short: "Show the placement decisions made for a Run", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			var ds []schemas.BookingDecision
			if err := readEvents(cmd.Context(), g.history(conn).events(args[0]), nil, func(ev schemas.RunEvent) {
				if ev.Decision != nil {
					ds = append(ds, *ev.Decision)
				}
			}); err != nil {
				return err
			}
			if len(ds) == 0 {
				return fmt.Errorf("no decision recorded for %s yet", args[0])
			}
			return g.render(cmd.OutOrStdout(), ds, func(tw *tabwriter.Writer) {
				for _, d := range ds {
					fmt.Fprintf(tw, "attempt %d decided %s, winner %s%s\n", d.Attempt, d.DecidedAt.UTC().Format(time.RFC3339), or(d.Winner, "none"), bookedAs(d))
					fmt.Fprintln(tw, "NODE\tELIGIBLE\tCOST(s)\tIMAGE\tPULL\tCACHE FILL\tQUEUE(s)\t$/H\tREASON\tDETAIL")
					for _, c := range d.Candidates {
						cost, image, pull, fill, queue, price := "-", "-", "-", "-", "-", "-"
						if c.Eligible {
							k := c.Components
							cost, image, pull, fill = fmt.Sprintf("%.1f", c.Cost), k.ImageState, schemas.FormatBytes(k.PullBytes), schemas.FormatBytes(k.CacheFillBytes)
							queue, price = fmt.Sprintf("%.0f", k.QueueSeconds), fmt.Sprintf("%.2f", k.PricePerHour)
						}
						fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.NodeID, c.Eligible, cost, image, pull, fill, queue, price, or(string(c.Reason), "winner"), c.Detail)
					}
					// A large fleet's decision names the other nodes by reason only.
					for _, reason := range slices.Sorted(maps.Keys(d.Others)) {
						ids := d.Others[reason]
						fmt.Fprintf(tw, "(%d more)\t-\t-\t-\t-\t-\t-\t-\t%s\t%s\n", len(ids), or(string(reason), "-"), strings.Join(ids, ","))
					}
					for _, v := range d.Victims {
						fmt.Fprintf(tw, "preempts %s on %s: %s, class %s, %.0f GPU-seconds lost\n", v.RunID, v.NodeID, v.Why, or(v.Priority, "(default)"), v.GPUSeconds)
					}
				}
			})
		},
	}
}

// bookedAs says how a decision books its winner: in its queue, to fetch
// the Run's bytes first, or (nothing said) to start now.
func bookedAs(d schemas.BookingDecision) string {
	switch {
	case d.Winner == "":
		return ""
	case d.WinnerQueued && d.FetchFirst:
		return " (queued behind its running work, fetching the Run's bytes meanwhile)"
	case d.WinnerQueued:
		return " (queued behind its running work)"
	case d.FetchFirst:
		return " (fetching the Run's bytes first; it takes its cards once they are there)"
	}
	return ""
}

// progressOf shows an image or artifact transfer under way, or "-".
func progressOf(r schemas.Run) string {
	if r.Progress == nil || r.Phase != schemas.PhasePreparing {
		return "-"
	}
	return r.Progress.What() + " " + r.Progress.String()
}

// executionOf names a lane attempt's execution: its connection, offer and
// id ("-" on a node).
func executionOf(r schemas.Run) string {
	x := r.Execution
	if x == nil {
		return "-"
	}
	return x.Connection + " " + x.OfferID + " " + or(x.ExecutionID, "(launch answer awaited)")
}
