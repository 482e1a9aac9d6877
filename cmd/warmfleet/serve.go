package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/logging"
)

func newServe(g *globals) *cobra.Command {
	var dataDir, listen string
	var port, replicas int
	var openEnrollment, waitForCapacity bool
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the control plane (with an embedded NATS server unless --nats-url is given)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logging.New(g.logLevel)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			url := g.natsURL
			if !cmd.Flags().Changed("nats-url") {
				srv, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: filepath.Join(dataDir, "jetstream"), Host: listen, Port: port})
				if err != nil {
					return err
				}
				defer srv.Shutdown()
				url = srv.URL()
				log.Info("embedded NATS listening", zap.String("url", url), zap.String("store", filepath.Join(dataDir, "jetstream")))
				fmt.Fprintf(cmd.OutOrStdout(), "warmfleet: embedded NATS at %s (data in %s)\n", url, dataDir)
			}
			conn, err := bus.Connect(url, "warmfleet-cp", log)
			if err != nil {
				return err
			}
			defer conn.Close()
			if err := conn.WaitConnected(cmd.Context()); err != nil {
				return err
			}
			cp, err := controlplane.New(cmd.Context(), conn, controlplane.Config{
				Topology: bus.Topology{Replicas: replicas}, OpenEnrollment: openEnrollment, WaitForCapacity: waitForCapacity,
			}, log)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "warmfleet: control plane serving on %s — submit with:\n  nats -s %s pub wf.runs.submit '{\"request_id\":\"hello-1\",\"image\":\"localhost/busybox@sha256:<digest>\",\"command\":[\"sh\",\"-c\",\"echo hi\"]}'\n", url, url)
			return cp.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "./.warmfleet", "directory for the embedded NATS file store")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1", "address the embedded NATS listens on")
	cmd.Flags().IntVar(&port, "port", 4222, "port the embedded NATS listens on (-1 for a random one)")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "replicas for every stream and bucket (3 on a JetStream cluster)")
	cmd.Flags().BoolVar(&openEnrollment, "open-enrollment", false, "admit agents without an enrollment token (development only)")
	cmd.Flags().BoolVar(&waitForCapacity, "wait-for-capacity", false, "keep Runs no node can run waiting instead of failing them")
	return cmd
}
