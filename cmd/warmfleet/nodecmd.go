package main

import (
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

func newNodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Inspect enrolled nodes"}
	cmd.AddCommand(&cobra.Command{
		Use: "list", Short: "List nodes in the registry",
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			kv, err := conn.JS.KeyValue(cmd.Context(), bus.BucketNodes)
			if err != nil {
				return err
			}
			lister, err := kv.ListKeys(cmd.Context())
			if err != nil {
				return err
			}
			var nodes []schemas.NodeRecord
			for k := range lister.Keys() {
				var n schemas.NodeRecord
				if _, err := bus.GetJSON(cmd.Context(), kv, k, &n); err == nil {
					n.SessionTokenHash = "" // not for display
					nodes = append(nodes, n)
				}
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
