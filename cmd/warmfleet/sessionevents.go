package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/runlog"
	"github.com/warmfleet/warmfleet/schemas"
)

// sessionEventsCmd prints a session's events from WF_EVENTS: where it
// became resident and from which checkpoint, and each checkpoint committed.
func sessionEventsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "events [TENANT.]SESSION", Short: "Show a session's events: attaches (with the checkpoint restored) and checkpoints", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := sessionKey(cmd, g, args[0])
			if err != nil {
				return err
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			src := runlog.StreamSource(conn.JS, bus.StreamEvents, bus.SessionEventsSubject(key.Tenant, key.Session))
			return readEvents(cmd.Context(), src, nil, func(ev schemas.SessionEvent) { printSessionEvent(cmd.OutOrStdout(), g, ev) })
		},
	}
}

func printSessionEvent(w io.Writer, g *globals, ev schemas.SessionEvent) {
	if g.output == "json" {
		b, _ := json.Marshal(ev)
		fmt.Fprintln(w, string(b))
		return
	}
	fmt.Fprintf(w, "%s  %-20s %-12s epoch %-4d %s\n", ev.At.UTC().Format(time.RFC3339), ev.Type, ev.Node, ev.Epoch, sessionEventText(ev))
}

// sessionEventText says what ev records beyond its type, node and epoch.
func sessionEventText(ev schemas.SessionEvent) string {
	switch ev.Type {
	case schemas.SessionAttached:
		r := ev.Restored
		switch {
		case r == nil:
			return "no checkpoint restored (empty workspace)"
		case r.TakenAt.IsZero():
			return fmt.Sprintf("restored checkpoint %d (epoch %d)", r.Sequence, r.Epoch)
		}
		return fmt.Sprintf("restored checkpoint %d (epoch %d), taken %s", r.Sequence, r.Epoch, r.TakenAt.UTC().Format(time.RFC3339))
	case schemas.SessionCheckpointed:
		if ev.Checkpoint == nil {
			return fmt.Sprintf("checkpoint %d (no workspace)", ev.Sequence)
		}
		c := ev.Checkpoint
		return fmt.Sprintf("checkpoint %d: %d files, %s, taken %s in %.1fs (%s sent)", ev.Sequence, c.Files, schemas.FormatBytes(c.Bytes),
			c.TakenAt.UTC().Format(time.RFC3339), c.Seconds, schemas.FormatBytes(c.BytesMoved))
	}
	return ""
}
