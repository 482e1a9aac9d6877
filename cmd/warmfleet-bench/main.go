// Command warmfleet-bench measures warmfleet against baselines taken in the
// same run, on the same NATS server: intake throughput against raw
// JetStream publish, the command round trip against core request/reply, a
// simulated fleet's cost against a control plane that does nothing,
// submit → running on real containerd against calling containerd directly,
// and a node's output shipping against raw JetStream publish of the same
// chunks, with the command round trip during a log flood.
//
// Every figure is reported with its baseline and their ratio, because a
// shared, noisy machine makes absolute numbers move from run to run while
// ratios hold. By default each subcommand starts an embedded NATS server
// on loopback and the control plane in-process, in a temp dir it removes.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/warmfleet/warmfleet/nodelog"

	"github.com/spf13/cobra"
)

func main() {
	// containerd's shim runs this binary as each workload's log writer.
	if code, ok := nodelog.WriterMain(os.Args); ok {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "warmfleet-bench:", err)
		os.Exit(1)
	}
}

// globals are the flags every subcommand shares.
type globals struct {
	output     string
	cpuProfile string
	cpLogLevel string
	keep       bool
	storeDir   string
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "warmfleet-bench",
		Short: "Measure warmfleet against same-run baselines (intake, rtt, fleet, e2e, logs)",
		Long: `warmfleet-bench measures warmfleet on this machine. Each figure comes with a
baseline measured in the same run on the same NATS server, and the ratio of
the two: on a shared machine the absolute numbers drift, the ratios hold.

  intake  Runs accepted and recorded per second vs raw JetStream publish-with-ack
  rtt     command → agent → receipt latency vs core NATS request/reply
  fleet   control-plane CPU and memory with N simulated agents vs a null control plane
  e2e     submit → container running on real containerd vs calling containerd directly
  logs    output shipped per second and CPU per MiB vs raw JetStream publish of the
          same chunks; command round trip while a Run floods its output vs idle
  jetsync acknowledged JetStream publishes with sync_interval: always vs the default`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	pf.StringVar(&g.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured phases (the process holding NATS and, except for fleet, the control plane) to this file")
	pf.StringVar(&g.cpLogLevel, "cp-log-level", "info", "control-plane log level (logs go to a file in the bench dir, as warmfleet serve logs to stderr); none to disable")
	pf.BoolVar(&g.keep, "keep", false, "keep the bench dir (NATS store, logs) instead of removing it")
	pf.StringVar(&g.storeDir, "store-dir", "", "keep the embedded NATS server's JetStream store under this dir instead of the bench dir, e.g. on another filesystem than agents' journals, as when they are separate machines")
	root.AddCommand(newIntakeCmd(g), newRTTCmd(g), newFleetCmd(g), newE2ECmd(g), newLogsCmd(g), newArtifactCmd(g), newCPServeCmd(), newFleetSimCmd(), newPlacementSimCmd(g), newJetSyncCmd(g), newCheckpointCmd(g))
	return root
}

// reporting is a measuring subcommand's RunE: measure, then print the
// report as --output asks.
func (g *globals) reporting(measure func(context.Context) (*Report, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		rep, err := measure(cmd.Context())
		if err != nil {
			return err
		}
		return rep.print(cmd.OutOrStdout(), g.output)
	}
}
