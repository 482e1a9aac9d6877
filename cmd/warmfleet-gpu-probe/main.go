// Command warmfleet-gpu-probe measures this host's NVIDIA cards through NVML
// and prints them as one JSON schemas.AcceleratorFacts on stdout; its logs
// go to stderr. The node agent runs it (adapters/gpuprobe) rather than
// linking NVML itself: go-nvml and containerd's client cannot share a
// binary (adapters/nvml/doc.go says why). It links no containerd.
//
// It always prints facts and exits 0 when it could say something: on a host
// without libnvidia-ml, {"established":true} (looked, found no driver); when
// NVML fails, {"established":false}. A non-zero exit means it printed
// nothing usable.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	wfnvml "github.com/warmfleet/warmfleet/adapters/nvml"
	"github.com/warmfleet/warmfleet/internal/logging"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "warmfleet-gpu-probe:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	var (
		library, logLevel string
		xidWindow         time.Duration
		timeout           time.Duration
		pretty            bool
	)
	cmd := &cobra.Command{
		Use:           "warmfleet-gpu-probe",
		Short:         "print this host's NVIDIA cards (NVML) as JSON accelerator facts",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logging.New(logLevel)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			var opts []nvml.LibraryOption
			if library != "" {
				opts = append(opts, nvml.WithLibraryPath(library))
			}
			return run(ctx, cmd.OutOrStdout(), nvml.New(opts...), log, xidWindow, pretty)
		},
	}
	f := cmd.Flags()
	f.StringVar(&library, "nvml-library", "", "NVML shared library to load (default: libnvidia-ml.so.1 from the loader's search path)")
	f.DurationVar(&xidWindow, "xid-window", wfnvml.DefaultXIDWindow, "how long to watch for XID critical errors after reading the cards (0: none)")
	f.DurationVar(&timeout, "timeout", 0, "give up and state nothing established after this long (0: no limit)")
	f.BoolVar(&pretty, "pretty", false, "indent the JSON for people")
	f.StringVar(&logLevel, "log-level", "warn", "log level on stderr: debug, info, warn, error")
	return cmd
}

// run probes lib once and writes the facts to out.
func run(ctx context.Context, out io.Writer, lib nvml.Interface, log *zap.Logger, xidWindow time.Duration, pretty bool) error {
	facts := wfnvml.New(lib, log, wfnvml.WithXIDWindow(xidWindow)).Probe(ctx)
	enc := json.NewEncoder(out)
	if pretty {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(facts); err != nil {
		return fmt.Errorf("write facts: %w", err)
	}
	return nil
}
