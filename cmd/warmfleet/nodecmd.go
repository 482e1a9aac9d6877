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

	"github.com/warmfleet/warmfleet/adapters/capacity/cloudinit"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

func newNodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Invite, inspect, drain and prune nodes"}
	cmd.AddCommand(newNodeInvite(g))
	cmd.AddCommand(newNodePrune(g))
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
			withLiveLeases(cmd.Context(), conn, nodes)
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
	var out, format string
	var opts cloudinit.Options
	cmd := &cobra.Command{
		Use:   "invite --node ID --generation N [--format cloud-init --agent-url URL --agent-sha256 HEX]",
		Short: "Mint a node bootstrap (single-use enrollment token) for warmfleet-agent --bootstrap, or cloud-init user data that installs it",
		RunE: func(cmd *cobra.Command, _ []string) error {
			req.TTLSeconds = int64(ttl / time.Second)
			if err := req.Validate(); err != nil {
				return err
			}
			// Options are checked before a token is minted, so a typo burns none.
			if err := checkInviteFormat(cmd, format, opts); err != nil {
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
			boot = append(boot, '\n')
			what := "bootstrap"
			if format == formatCloudInit {
				if boot, err = cloudinit.Render(*rep.OK, opts); err != nil {
					return fmt.Errorf("invite: cloud-init user data: %w", err)
				}
				what = "cloud-init user data"
			}
			if out == "" {
				_, err = cmd.OutOrStdout().Write(boot)
				return err
			}
			if err := os.WriteFile(out, boot, 0o600); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s for %s (generation %d) written to %s; it expires %s and works once\n",
				what, rep.OK.NodeID, rep.OK.Generation, out, rep.OK.ExpiresAt.UTC().Format(time.RFC3339))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.NodeID, "node", "", "node identity the token admits")
	f.StringVar(&req.RentalID, "rental", "", "rental the node belongs to")
	f.Uint64Var(&req.Generation, "generation", 1, "lifecycle generation the token admits")
	f.DurationVar(&ttl, "ttl", 15*time.Minute, "how long the token is good for")
	f.StringVar(&out, "out", "", "write the bootstrap to this file (0600) instead of stdout")
	f.StringVar(&format, "format", formatJSON, "what to write: json (the bootstrap file) or cloud-init (#cloud-config user data for a rented machine)")
	f.StringVar(&opts.AgentURL, "agent-url", "", "cloud-init: http(s) URL of the warmfleet-agent binary to download")
	f.StringVar(&opts.AgentSHA256, "agent-sha256", "", "cloud-init: sha256 of that binary; the machine refuses to start a mismatch")
	f.BoolVar(&opts.AgentPreinstalled, "agent-preinstalled", false, "cloud-init: the image already has "+cloudinit.AgentPath)
	f.BoolVar(&opts.InstallContainerd, "install-containerd", false, "cloud-init: apt-install containerd and runc (Debian/Ubuntu)")
	f.BoolVar(&opts.NVIDIAContainerToolkit, "nvidia-container-toolkit", false, "cloud-init: apt-install nvidia-container-toolkit (NVIDIA's apt repository must be on the image)")
	f.StringSliceVar(&opts.Packages, "package", nil, "cloud-init: extra apt package to install (repeatable)")
	return cmd
}

// Output formats of node invite.
const (
	formatJSON      = "json"
	formatCloudInit = "cloud-init"
)

// cloudInitFlags only mean something with --format cloud-init.
var cloudInitFlags = []string{"agent-url", "agent-sha256", "agent-preinstalled", "install-containerd", "nvidia-container-toolkit", "package"}

// checkInviteFormat refuses an unknown --format, cloud-init flags without
// --format cloud-init, and invalid cloud-init options.
func checkInviteFormat(cmd *cobra.Command, format string, opts cloudinit.Options) error {
	switch format {
	case formatJSON:
		for _, name := range cloudInitFlags {
			if cmd.Flags().Changed(name) {
				return fmt.Errorf("invite: --%s applies only to --format %s", name, formatCloudInit)
			}
		}
		return nil
	case formatCloudInit:
		if err := opts.Validate(); err != nil {
			return fmt.Errorf("invite: %w", err)
		}
		return nil
	default:
		return fmt.Errorf("invite: --format %q: want %s or %s", format, formatJSON, formatCloudInit)
	}
}
