// Command warmfleet is the control plane (`warmfleet serve`) and the
// operator CLI (`warmfleet run …`, `warmfleet node …`).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		stop()
		os.Exit(exitCode(os.Stderr, err))
	}
}

// exitCode prints err to w and returns the status to exit with: an
// exitStatus's own code (printing nothing when it has nothing to say),
// else 1.
func exitCode(w io.Writer, err error) int {
	var st *exitStatus
	if errors.As(err, &st) {
		if st.err != nil {
			fmt.Fprintln(w, "warmfleet:", st.err)
		}
		return st.code
	}
	fmt.Fprintln(w, "warmfleet:", err)
	return 1
}

// globals are the flags every subcommand shares.
type globals struct {
	natsURL  string
	output   string
	logLevel string
	// urlSet: --nats-url or WARMFLEET_NATS_URL named the server, which
	// then wins over a discovered operator login's URL.
	urlSet func() bool
	// tenant is the tenant per-tenant commands act in (--tenant,
	// WARMFLEET_TENANT); a producer's login must name its own.
	tenant string
	// loginDirs are searched in order for serve's operator login when the
	// environment names none.
	loginDirs []string
}

func newRoot() *cobra.Command {
	g := &globals{loginDirs: operatorLoginDirs()}
	root := &cobra.Command{
		Use:           "warmfleet",
		Short:         "GPU fleet control plane: places Runs on the warmest machine that fits",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.natsURL, "nats-url", envOr("WARMFLEET_NATS_URL", "nats://127.0.0.1:4222"), "NATS server URL")
	g.urlSet = func() bool {
		return root.PersistentFlags().Changed("nats-url") || os.Getenv("WARMFLEET_NATS_URL") != ""
	}
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	root.PersistentFlags().StringVar(&g.tenant, "tenant", envOr(envTenant, schemas.DefaultTenant), "tenant to act in (a producer's login acts in its own only)")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(newServe(g), newRunCmd(g), newNodeCmd(g), newRentalCmd(g), newSessionCmd(g), newPrefetchCmd(g), newArtifactCmd(g), newSecretCmd(g), newDevCmd())
	root.AddCommand(newPolicyCmd(g))
	root.AddCommand(newUsageCmd(g))
	return root
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// identity is the name this CLI logs in as: the producer named by
// WARMFLEET_NATS_PRODUCER, else the operator. Submit and cancel subjects
// carry it (bus.SubmitSubject).
func (g *globals) identity() string {
	return envOr(bus.EnvNATSInboxName, bus.OperatorUser)
}
