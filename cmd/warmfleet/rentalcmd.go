package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

func newRentalCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "rental", Short: "Inspect and retire rented machines"}
	cmd.AddCommand(&cobra.Command{
		Use: "list", Short: "List rentals",
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			rs, err := listJSON[schemas.Rental](cmd.Context(), conn, bus.BucketRentals)
			if err != nil {
				return err
			}
			slices.SortFunc(rs, func(a, b schemas.Rental) int { return b.CreatedAt.Compare(a.CreatedAt) })
			conns, connErr := admin[[]schemas.ConnectionStatus](cmd.Context(), conn, bus.SubjectConnections, schemas.AdminRequest{})
			defer func() {
				if g.output == "" || g.output == "table" {
					fmt.Fprintln(cmd.OutOrStdout())
					printConnections(cmd.OutOrStdout(), conns, connErr)
				}
			}()
			return g.render(cmd.OutOrStdout(), rs, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "RENTAL\tCONNECTION\tSTATE\tKIND\tNODE\tOFFER\tNATIVE\tGEN\t$/H\tCREATED\tLAST ERROR")
				for _, r := range rs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%.2f\t%s\t%s\n", r.RentalID, or(r.ConnectionID, "-"), r.State, schemas.CapacityKind(r.Interruptible), r.NodeID, r.OfferID,
						or(r.NativeRef, "-"), r.Generation, r.PricePerHour, r.CreatedAt.UTC().Format(time.RFC3339), or(r.LastError, "-"))
				}
			})
		},
	}, &cobra.Command{
		Use: "connections", Short: "Show each capacity provider and ephemeral lane connection: verified or failed (and skipped), its live rentals or executions and limit",
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			conns, err := admin[[]schemas.ConnectionStatus](cmd.Context(), conn, bus.SubjectConnections, schemas.AdminRequest{})
			if err != nil {
				return err
			}
			return g.render(cmd.OutOrStdout(), conns, func(tw *tabwriter.Writer) { connectionRows(tw, conns) })
		},
	}, &cobra.Command{
		Use: "get RENTAL_ID", Short: "Show one rental with its stage timeline", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			r, err := getJSON[schemas.Rental](cmd.Context(), conn, bus.BucketRentals, args[0], "rental")
			if err != nil {
				return err
			}
			return g.render(cmd.OutOrStdout(), r, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "Rental:\t%s\nConnection:\t%s\nState:\t%s\nKind:\t%s\nNode:\t%s\nOffer:\t%s (%s)\nNative ref:\t%s\nGeneration:\t%d\nPrice:\t$%.2f/h\nChosen:\t%s\nLast error:\t%s\n",
					r.RentalID, or(r.ConnectionID, "-"), r.State, schemas.CapacityKind(r.Interruptible), r.NodeID, r.OfferID, schemas.PoolName(r.Region, r.GPUModel), or(r.NativeRef, "-"), r.Generation, r.PricePerHour,
					or(r.Why, "-"), or(r.LastError, "-"))
				fmt.Fprintln(tw, "STAGE\tAT\tSOURCE")
				for _, s := range r.Stages {
					src := "provider"
					switch {
					case s.Bound:
						src = "observed by the control plane (a bound)"
					case s.Source == schemas.StageFromControlPlane:
						src = "control plane's own act"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\n", s.State, s.At.UTC().Format(time.RFC3339Nano), src)
				}
			})
		},
	}, &cobra.Command{
		Use: "retire RENTAL_ID", Short: "Retire a ready rental once its node is idle", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			r, err := admin[schemas.Rental](cmd.Context(), conn, bus.SubjectRetire, schemas.AdminRequest{ID: args[0]})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rental %s is %s; it is stopped or terminated once its node is idle\n", r.RentalID, r.State)
			return nil
		},
	})
	return cmd
}

// nodeExtraCmds are `node get` and `node drain`.
func nodeExtraCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{{
		Use: "get NODE_ID", Short: "Show one node with its facts", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			n, err := getJSON[schemas.NodeRecord](cmd.Context(), conn, bus.BucketNodes, args[0], "node")
			if err != nil {
				return err
			}
			n.SessionTokenHash = ""
			one := []schemas.NodeRecord{n}
			withLiveLeases(cmd.Context(), conn, one)
			n = one[0]
			return g.render(cmd.OutOrStdout(), n, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "Node:\t%s\nState:\t%s\nLive:\t%v\nFencing token:\t%d\nGeneration:\t%d\nRental:\t%s\nCapacity:\t%dm CPU, %d bytes, %d GPUs\nLease expires:\t%s\n",
					n.NodeID, n.State, n.Live(time.Now()), n.FencingToken, n.Generation, or(n.RentalID, "-"), n.Capacity.CPUMillis, n.Capacity.MemoryBytes, n.Capacity.GPUCount,
					n.LeaseExpires.UTC().Format(time.RFC3339))
				if f := n.Facts; f != nil {
					acc := "none found"
					if !f.Host.Accelerator.Established {
						acc = "not established"
					} else if f.Host.Accelerator.Vendor != "" {
						acc = f.Host.Accelerator.Vendor + " driver " + f.Host.Accelerator.DriverVersion
					}
					disk := "unknown"
					if f.Host.Disk.Known {
						disk = fmt.Sprintf("%s free of %s", schemas.FormatBytes(f.Host.Disk.FreeBytes), schemas.FormatBytes(f.Host.Disk.TotalBytes))
					}
					host := schemas.Platform{OS: f.Host.OS, Architecture: f.Host.Architecture, Variant: f.Host.Variant}
					fmt.Fprintf(tw, "Host:\t%s, kernel %s, %s %s\nAccelerator:\t%s\nDisk:\t%s\nFacts observed:\t%s\n", host, f.Host.KernelVersion,
						f.Host.ContainerRuntime, f.Host.RuntimeVersion, acc, disk, f.ObservedAt.UTC().Format(time.RFC3339))
					var imgs []string
					for _, im := range f.Images {
						img := im.ManifestDigest[:min(19, len(im.ManifestDigest))] + "… " + string(im.State)
						if im.Index {
							img += " (" + im.Platform.String() + " of an index)"
						}
						imgs = append(imgs, img)
					}
					fmt.Fprintf(tw, "Images:\t%s\n", or(strings.Join(imgs, ", "), "-"))
					fmt.Fprintf(tw, "Support:\t%s\n", describeSupport(f.Supports(), f.Support != nil))
				}
			})
		},
	}, {
		Use: "drain NODE_ID", Short: "Stop placing Runs and sessions on a node; release its sessions; what runs there finishes", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			rep, err := drainNode(cmd.Context(), conn, args[0])
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.render(cmd.OutOrStdout(), rep, nil)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s is %s\n", rep.OK.NodeID, rep.OK.State)
			printDrainSessions(cmd.OutOrStdout(), rep.Sessions)
			if rep.Sessions != nil && len(rep.Sessions.Failures) > 0 {
				return fmt.Errorf("%d session(s) on %s could not be released", len(rep.Sessions.Failures), rep.OK.NodeID)
			}
			return nil
		},
	}}
}

// describeSupport says what a node declares it can do, or that it declares
// nothing and is read as agents before NodeSupport behaved.
func describeSupport(s schemas.NodeSupport, declared bool) string {
	var parts []string
	flag := func(on bool, what string) {
		if !on {
			what = "no " + what
		}
		parts = append(parts, what)
	}
	flag(s.ExactImageInventory, "exact image inventory")
	flag(s.CacheMounts, "cache mounts")
	flag(s.Prewarm, "prewarm")
	if s.GarbageCollection && s.DiskWatermarks != nil {
		parts = append(parts, fmt.Sprintf("disk collection %d%%→%d%%", s.DiskWatermarks.High, s.DiskWatermarks.Low))
	} else {
		parts = append(parts, "no disk collection")
	}
	if s.MaxConcurrentWorkloads > 0 {
		parts = append(parts, fmt.Sprintf("at most %d workloads", s.MaxConcurrentWorkloads))
	}
	if !declared {
		return "not declared (read as: " + strings.Join(parts, ", ") + ")"
	}
	return strings.Join(parts, ", ")
}

// printConnections writes the connections table under a rental list, or
// why there is none.
func printConnections(w io.Writer, conns []schemas.ConnectionStatus, err error) {
	if err != nil {
		fmt.Fprintf(w, "connections: %v (is a control plane with a capacity provider running?)\n", err)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	connectionRows(tw, conns)
	_ = tw.Flush()
}

func connectionRows(tw *tabwriter.Writer, conns []schemas.ConnectionStatus) {
	fmt.Fprintln(tw, "CONNECTION\tTYPE\tSTATE\tLIVE\tMAX\tVERIFIED\tERROR")
	for _, c := range conns {
		limit, verified := "-", "-"
		if c.MaxRentals > 0 {
			limit = strconv.Itoa(c.MaxRentals)
		}
		if !c.VerifiedAt.IsZero() {
			verified = c.VerifiedAt.UTC().Format(time.RFC3339)
		}
		state, typ := c.State, c.Type
		if c.State == schemas.ConnectionFailed {
			state += " (skipped)"
		}
		if c.Lane {
			typ += " (lane)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", c.ID, typ, state, c.Live, limit, verified, or(c.Error, "-"))
	}
}
