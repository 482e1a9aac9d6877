package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/nodes"
	"github.com/warmfleet/warmfleet/schemas"
)

func newNodePrune(g *globals) *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "prune NODE_ID [--dry-run]",
		Short: "Remove every image and cache on a node that no running or booked Run uses; --dry-run lists what would go",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := schemas.PruneRequest{NodeID: args[0], DryRun: dryRun}
			if err := req.Validate(); err != nil {
				return err
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			rep, err := pruneNode(cmd.Context(), conn, req)
			if err != nil {
				return err
			}
			return g.render(cmd.OutOrStdout(), rep, func(tw *tabwriter.Writer) { printPrune(tw, rep) })
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be removed, and remove nothing")
	return cmd
}

// pruneNode asks the control plane to prune a node and returns the node's
// report.
func pruneNode(ctx context.Context, conn *bus.Conn, req schemas.PruneRequest) (schemas.PruneReport, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return schemas.PruneReport{}, err
	}
	// The control plane waits up to nodes.PruneTimeout for the node.
	ctx, cancel := context.WithTimeout(ctx, nodes.PruneTimeout+15*time.Second)
	defer cancel()
	resp, err := conn.NC.RequestWithContext(ctx, bus.SubjectPrune, b)
	if err != nil {
		return schemas.PruneReport{}, fmt.Errorf("prune: no control plane answered on %s: %w", bus.SubjectPrune, err)
	}
	var rep schemas.Reply[schemas.PruneReport]
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		return schemas.PruneReport{}, fmt.Errorf("prune: reply: %w", err)
	}
	if rep.Refusal != nil {
		return schemas.PruneReport{}, rep.Refusal
	}
	if rep.OK == nil {
		return schemas.PruneReport{}, errors.New("prune: empty reply")
	}
	return *rep.OK, nil
}

// printPrune writes what was (or would be) removed, with sizes, and what
// was kept and why.
func printPrune(w io.Writer, r schemas.PruneReport) {
	verb := "removed"
	if r.DryRun {
		verb = "would remove"
	}
	fmt.Fprintf(w, "node %s: %s %d item(s), %s\n", r.NodeID, verb, len(r.Removed), schemas.FormatBytes(r.FreedBytes))
	if r.Before.Known && !r.DryRun {
		fmt.Fprintf(w, "disk: %s free before, %s free after, of %s\n", schemas.FormatBytes(r.Before.FreeBytes), schemas.FormatBytes(r.After.FreeBytes), schemas.FormatBytes(r.Before.TotalBytes))
	}
	fmt.Fprintln(w, "\tKIND\tID\tSIZE\tLAST USED\tWHY")
	section := func(label string, items []schemas.DiskItem) {
		for _, it := range items {
			last := "never"
			if !it.LastUsedAt.IsZero() {
				last = it.LastUsedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", label, it.Kind, it.ID, schemas.FormatBytes(it.SizeBytes), last, it.Reason)
		}
	}
	if r.DryRun {
		section("would remove", r.Removed)
	} else {
		section("removed", r.Removed)
	}
	section("kept", r.Kept)
	section("failed", r.Failed)
}
