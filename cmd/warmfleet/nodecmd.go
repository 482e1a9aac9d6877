package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

func newNodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Invite and inspect nodes"}
	cmd.AddCommand(newNodeInvite(g))
	cmd.AddCommand(nodeExtraCmds(g)...)
	cmd.AddCommand(&cobra.Command{
		Use: "list", Short: "List nodes in the registry",
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			nodes, err := listJSON[schemas.NodeRecord](cmd.Context(), conn, bus.BucketNodes)
			if err != nil {
				return err
			}
			for i := range nodes {
				nodes[i].SessionTokenHash = "" // not for display
			}
			slices.SortFunc(nodes, func(a, b schemas.NodeRecord) int { return strings.Compare(a.NodeID, b.NodeID) })
			now := time.Now()
			return g.render(cmd.OutOrStdout(), nodes, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "NODE\tSTATE\tLIVE\tFENCING\tGEN\tCPU(m)\tMEMORY\tGPUS\tRUNTIME\tLEASE EXPIRES")
				for _, n := range nodes {
					rt := "-"
					if n.Facts != nil {
						rt = n.Facts.Host.ContainerRuntime + " " + n.Facts.Host.RuntimeVersion
					}
					fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", n.NodeID, n.State, n.Live(now), n.FencingToken, n.Generation,
						n.Capacity.CPUMillis, n.Capacity.MemoryBytes, n.Capacity.GPUCount, rt, n.LeaseExpires.UTC().Format(time.RFC3339))
				}
			})
		},
	})
	return cmd
}

func newNodeInvite(g *globals) *cobra.Command {
	var req schemas.InviteRequest
	var ttl time.Duration
	var out string
	cmd := &cobra.Command{
		Use:   "invite --node ID --generation N",
		Short: "Mint a node bootstrap (single-use enrollment token) for warmfleet-agent --bootstrap",
		RunE: func(cmd *cobra.Command, _ []string) error {
			req.TTLSeconds = int64(ttl / time.Second)
			if err := req.Validate(); err != nil {
				return err
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			b, _ := json.Marshal(req)
			resp, err := conn.NC.RequestWithContext(cmd.Context(), bus.SubjectInvite, b)
			if err != nil {
				return fmt.Errorf("invite: no control plane answered on %s: %w", bus.SubjectInvite, err)
			}
			var rep schemas.Reply[schemas.NodeBootstrap]
			if err := json.Unmarshal(resp.Data, &rep); err != nil {
				return fmt.Errorf("invite: reply: %w", err)
			}
			if rep.Refusal != nil {
				return rep.Refusal
			}
			if rep.OK == nil {
				return errors.New("invite: empty reply")
			}
			boot, _ := json.MarshalIndent(rep.OK, "", "  ")
			if out == "" {
				_, err = fmt.Fprintln(cmd.OutOrStdout(), string(boot))
				return err
			}
			if err := os.WriteFile(out, append(boot, '\n'), 0o600); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "bootstrap for %s (generation %d) written to %s; it expires %s and works once\n",
				rep.OK.NodeID, rep.OK.Generation, out, rep.OK.ExpiresAt.UTC().Format(time.RFC3339))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.NodeID, "node", "", "node identity the token admits")
	f.StringVar(&req.RentalID, "rental", "", "rental the node belongs to")
	f.Uint64Var(&req.Generation, "generation", 1, "lifecycle generation the token admits")
	f.DurationVar(&ttl, "ttl", 15*time.Minute, "how long the token is good for")
	f.StringVar(&out, "out", "", "write the bootstrap to this file (0600) instead of stdout")
	return cmd
}
