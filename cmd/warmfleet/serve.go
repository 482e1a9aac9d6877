package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/internal/logging"
	"github.com/warmfleet/warmfleet/internal/metrics"
)

func newServe(g *globals) *cobra.Command {
	var dataDir, listen, metricsAddr string
	var policyFile string
	var checkpointsKept int
	var port, replicas int
	var logsMaxAge, runRetention, eventsMaxAge time.Duration
	var logsMaxBytes int64
	var logsMaxChunksPerRun int64
	var openEnrollment, waitForCapacity, syncAlways bool
	var sec serveSecurity
	var capf serveCapacity
	var regAuth serveRegistryAuth
	var artAuth serveArtifactSourceAuth
	var credLimit serveCredentialLimit
	var secretsKeys serveSecrets
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the control plane (with an embedded NATS server unless --nats-url is given)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if logsMaxAge <= 0 {
				return fmt.Errorf("--logs-max-age %s: pass a positive duration such as 168h", logsMaxAge)
			}
			if logsMaxBytes <= 0 {
				return fmt.Errorf("--logs-max-bytes %d: pass a positive number of bytes", logsMaxBytes)
			}
			if logsMaxChunksPerRun <= 0 {
				return fmt.Errorf("--logs-max-chunks-per-run %d: pass a positive number of chunks", logsMaxChunksPerRun)
			}
			if err := checkRetentionFlags(runRetention, eventsMaxAge); err != nil {
				return err
			}
			// A bad providers file stops serve before anything starts.
			if err := capf.checkProvidersFile(cmd.Flags()); err != nil {
				return err
			}
			// A bad policy file stops serve before anything starts.
			if policyFile != "" {
				if _, err := policy.Read(policyFile); err != nil {
					return fmt.Errorf("--scheduling-policy-file: %w", err)
				}
			}
			log, err := logging.New(g.logLevel)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			// A malformed credentials file stops serve before anything starts.
			registryAuth, err := regAuth.build(log)
			if err != nil {
				return err
			}
			artifactSourceAuth, err := artAuth.build(log)
			if err != nil {
				return err
			}
			credentialLimit, err := credLimit.build()
			if err != nil {
				return err
			}
			url := g.natsURL
			embedded := !cmd.Flags().Changed("nats-url")
			if err := sec.checkListen(embedded, listen, log); err != nil {
				return err
			}
			if err := sec.prepare(embedded, dataDir, listen, log); err != nil {
				return err
			}
			secretsKeyFile, err := secretsKeys.build(embedded, dataDir, log)
			if err != nil {
				return err
			}
			caPEM, err := sec.controlPlaneCA()
			if err != nil {
				return err
			}
			if embedded {
				srv, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: filepath.Join(dataDir, "jetstream"), Host: listen, Port: port,
					Auth: sec.embeddedAuth(), TLS: sec.serverTLS, SyncAlways: syncAlways})
				if err != nil {
					return err
				}
				defer srv.Shutdown()
				url = srv.URL()
				log.Info("embedded NATS listening", zap.String("url", url), zap.String("store", filepath.Join(dataDir, "jetstream")))
				fmt.Fprintf(cmd.OutOrStdout(), "warmfleet: embedded NATS at %s (data in %s)\n", url, dataDir)
				if err := sec.publish(dataDir, url, log); err != nil {
					return err
				}
			}
			copts, err := sec.clientOptions()
			if err != nil {
				return err
			}
			conn, err := bus.Connect(url, "warmfleet-cp", log, copts...)
			if err != nil {
				return err
			}
			defer conn.Close()
			if err := conn.WaitConnected(cmd.Context()); err != nil {
				return err
			}
			capCfg, laneCfg, stopMachines, err := capf.build(cmd.Context(), cmd.Flags(), dataDir, log)
			if err != nil {
				return err
			}
			defer stopMachines()
			cp, err := controlplane.New(cmd.Context(), conn, controlplane.Config{
				Topology: bus.Topology{Replicas: replicas, LogsMaxAge: logsMaxAge, LogsMaxBytes: logsMaxBytes, LogsMaxChunksPerRun: logsMaxChunksPerRun, EventsMaxAge: eventsMaxAge}, OpenEnrollment: openEnrollment, WaitForCapacity: waitForCapacity, ControlPlaneCA: caPEM, RunRetention: runRetention,
				Capacity: capCfg, Lane: laneCfg, RegistryAuth: registryAuth, ArtifactSourceAuth: artifactSourceAuth, Auth: sec.authConfig(log),
				CredentialLimit: credentialLimit, Tenants: sec.tenants(), SecretsKeyFile: secretsKeyFile,
				SchedulingPolicyFile: policyFile, Sessions: sessions.Config{CheckpointsKept: checkpointsKept},
			}, log)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			var metricsDone chan error
			if metricsAddr != "" {
				if metricsDone, err = serveCPMetrics(ctx, cancel, cmd, metricsAddr, conn, cp, log); err != nil {
					return err
				}
			}
			natsArgs := "-s " + url
			if embedded && sec.auth {
				natsArgs = "--context " + filepath.Join(dataDir, bus.OperatorContextFile)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "warmfleet: control plane serving on %s — submit with:\n  nats %s pub wf.runs.default.operator.submit '{\"request_id\":\"hello-1\",\"image\":\"localhost/busybox@sha256:<digest>\",\"command\":[\"sh\",\"-c\",\"echo hi\"]}'\n", url, natsArgs)
			runErr := cp.Run(ctx)
			cancel()
			if metricsDone != nil {
				if err := <-metricsDone; err != nil {
					return err
				}
			}
			return runErr
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "./.warmfleet", "directory for the embedded NATS file store")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1", "address the embedded NATS listens on")
	cmd.Flags().IntVar(&port, "port", 4222, "port the embedded NATS listens on (-1 for a random one)")
	cmd.Flags().BoolVar(&syncAlways, "nats-sync-always", true, "embedded NATS: fsync every JetStream write before acknowledging it; false acknowledges at once and flushes every two minutes, losing acknowledged Runs on power loss for a higher write rate (docs/benchmarks.md, 9)")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "replicas for every stream and bucket (3 on a JetStream cluster)")
	cmd.Flags().DurationVar(&logsMaxAge, "logs-max-age", bus.DefaultLogsMaxAge, "how long WF_LOGS keeps Run and session output")
	cmd.Flags().Int64Var(&logsMaxBytes, "logs-max-bytes", bus.DefaultLogsMaxBytes, "how many bytes of output WF_LOGS keeps; the oldest go first")
	cmd.Flags().Int64Var(&logsMaxChunksPerRun, "logs-max-chunks-per-run", bus.DefaultLogsMaxChunksPerRun,
		"how many chunks (each at most 64 KiB) WF_LOGS keeps per Run or session; past it that Run's oldest go, never another's")
	cmd.Flags().DurationVar(&runRetention, "run-retention", controlplane.DefaultRunRetention, "how long an ended Run stays in wf_runs (run get, run list, request-id dedupe) before it is removed")
	cmd.Flags().DurationVar(&eventsMaxAge, "events-max-age", 0, "how long WF_EVENTS keeps Run events; longer than --run-retention (default: twice --run-retention)")
	cmd.Flags().BoolVar(&openEnrollment, "open-enrollment", false, "admit agents without an enrollment token (development only)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus /metrics, /healthz and /readyz on this host:port, e.g. 127.0.0.1:9090 (default: off)")
	sec.register(cmd)
	capf.register(cmd)
	regAuth.register(cmd)
	artAuth.register(cmd)
	credLimit.register(cmd)
	secretsKeys.register(cmd)
	cmd.Flags().BoolVar(&waitForCapacity, "wait-for-capacity", false, "keep Runs no node can run waiting instead of failing them")
	cmd.Flags().StringVar(&policyFile, "scheduling-policy-file", "", "JSON scheduling policy: priority classes, tenants' quotas, cohorts, weights, budgets and default retry (docs/scheduling.md); read again when it changes, a bad new file keeping the policy last read; check it with `warmfleet policy check FILE` (default: none, oldest first with no limits)")
	cmd.Flags().IntVar(&checkpointsKept, "session-checkpoints-kept", 3, "workspace checkpoints of each session whose content is kept in wf_checkpoints; an older one's is deleted once a newer one is committed")
	return cmd
}

// serveCPMetrics opens the metrics listener (so a taken port fails serve at
// once) and serves the control plane's registry until ctx ends. The Runs by
// phase are counted from the control plane's cache of wf_runs, so a scrape
// costs no KV reads. /readyz answers 200 once the control plane serves every subject
// and while its NATS connection is up. If the metrics server fails, it
// cancels the control plane too (through cancel) and the error comes back
// on the returned channel.
func serveCPMetrics(ctx context.Context, cancel context.CancelFunc, cmd *cobra.Command, addr string, conn *bus.Conn,
	cp *controlplane.ControlPlane, log *zap.Logger) (chan error, error) {
	ln, err := metrics.Listen(addr)
	if err != nil {
		return nil, err
	}
	ready := func() bool {
		select {
		case <-cp.Ready():
			return conn.NC.IsConnected()
		default:
			return false
		}
	}
	reg := metrics.NewControlPlaneRegistry(cp.Metrics)
	done := make(chan error, 1)
	go func() {
		err := metrics.ServeListener(ctx, ln, reg, ready)
		if err != nil {
			log.Error("metrics server stopped", zap.Error(err))
			cancel()
		}
		done <- err
	}()
	log.Info("metrics listening", zap.String("addr", ln.Addr().String()))
	fmt.Fprintf(cmd.OutOrStdout(), "warmfleet: metrics at http://%s/metrics (also /healthz, /readyz)\n", ln.Addr())
	return done, nil
}

// checkRetentionFlags refuses a retention that keeps nothing, and events
// kept no longer than the Runs they describe.
func checkRetentionFlags(runRetention, eventsMaxAge time.Duration) error {
	if runRetention <= 0 {
		return fmt.Errorf("--run-retention %s: pass a positive duration such as 168h", runRetention)
	}
	if eventsMaxAge < 0 || eventsMaxAge > 0 && eventsMaxAge <= runRetention {
		return fmt.Errorf("--events-max-age %s: pass a duration longer than --run-retention (%s), or leave it out for twice that", eventsMaxAge, runRetention)
	}
	return nil
}
