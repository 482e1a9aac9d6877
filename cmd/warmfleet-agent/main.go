// Command warmfleet-agent is the node agent. It dials out to NATS (it opens
// no port), enrolls, and runs the control plane's commands through
// containerd.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/cdispec"
	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/adapters/gpuprobe"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/logging"
	"github.com/warmfleet/warmfleet/internal/metrics"
	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

func main() {
	// containerd's shim runs this binary as each workload's log writer.
	if code, ok := nodelog.WriterMain(os.Args); ok {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "warmfleet-agent:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	var (
		natsURL, nodeID, rentalID, dataDir, ctrdAddr, ctrdNS, imageDir, logLevel, bootstrap string
		contentRoot, cacheDir, metricsAddr, gpuProbe, nvmlLibrary                           string
		cdiDirs, insecureRegistries                                                         []string
		factsInterval, gpuProbeTimeout                                                      time.Duration
		generation                                                                          uint64
		capacity                                                                            schemas.Resources
		maxWorkloads                                                                        int
		natsAuth, allowHostNetwork, authWithoutTLS                                          bool
		netOpts                                                                             containerd.NetworkOptions
		natsTLS                                                                             bus.TLSFiles
		logRate, logBurst                                                                   int64
		sessFlags                                                                           *sessionFlags
		noticeFlags                                                                         *interruptionFlags
		diskHigh, diskLow                                                                   int
	)
	cmd := &cobra.Command{
		Use:           "warmfleet-agent",
		Short:         "warmfleet node agent: runs the control plane's workloads through containerd",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logging.New(logLevel)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			watermarks, err := diskWatermarks(diskHigh, diskLow)
			if err != nil {
				return err
			}
			var token string
			if bootstrap != "" {
				b, err := readBootstrap(bootstrap)
				if err != nil {
					return err
				}
				// The bootstrap names the node; flags only fill what it leaves out.
				nodeID, rentalID, generation, token = b.NodeID, b.RentalID, b.Generation, b.EnrollmentToken
				if !cmd.Flags().Changed("nats-url") && b.ControlPlaneURL != "" {
					natsURL = b.ControlPlaneURL
				}
				if natsTLS.CAFile == "" {
					natsTLS.CAPEM = b.ControlPlaneCA // --tls-ca wins
				}
			}
			if err := checkAuthTransport(natsAuth, authWithoutTLS, natsURL, natsTLS, log); err != nil {
				return err
			}
			if nodeID == "" {
				host, _ := os.Hostname()
				nodeID = host
			}
			if dataDir == "" {
				dataDir = filepath.Join("/var/lib/warmfleet-agent", nodeID)
			}
			rt, err := containerd.New(cmd.Context(), containerd.Options{Address: ctrdAddr, Namespace: ctrdNS, ImageDir: imageDir,
				LogDir: filepath.Join(dataDir, "logs"), StateDir: filepath.Join(dataDir, "runtime"), Network: netOpts, Logger: log, CDISpecDirs: cdiDirs,
				InsecureRegistries: insecureRegistries})
			if err != nil {
				return fmt.Errorf("containerd at %s: %w (is containerd running? `containerd --version`; set --containerd-address)", ctrdAddr, err)
			}
			defer rt.Close()
			opts, err := natsTLS.ClientOptions()
			if err != nil {
				return err
			}
			var creds *bus.Credentials
			if natsAuth {
				// Logs in as the node with its saved session, else its bootstrap
				// token; after enrolling the agent swaps in its new session token.
				// The inbox prefix is the bootstrap token's login's, when it has one.
				creds = bus.AgentCredentials(nodeID, agent.LoginSecret(agent.Config{NodeID: nodeID, Generation: generation, DataDir: dataDir, EnrollmentToken: token}), token)
				opts = append(opts, creds.Options()...)
			}
			conn, err := bus.Connect(natsURL, "warmfleet-agent-"+nodeID, log, opts...)
			if err != nil {
				return err
			}
			defer conn.Close()
			// The registry exists before the agent so shipping can count into
			// it; the session collector reads the agent once it exists.
			var a *agent.Agent
			var reg *prometheus.Registry
			var logMetrics agent.LogMetrics
			var imageMetrics agent.ImageMetrics
			var diskMetrics agent.DiskMetrics
			if metricsAddr != "" {
				reg = metrics.NewAgentRegistry(nodeID, func() schemas.Enrollment {
					if a == nil {
						return schemas.Enrollment{}
					}
					return a.Enrollment()
				})
				logMetrics = metrics.NewAgentLogs(reg, nodeID)
				imageMetrics = metrics.NewAgentImages(reg, nodeID)
				diskMetrics = metrics.NewAgentDisk(reg, nodeID)
				sessMetrics := metrics.NewAgentSessions(reg, nodeID)
				sessFlags.hooks.OnCheckpoint = func(e residency.CheckpointEvent) {
					sessMetrics.Checkpointed(e.Kind, e.Moved, e.Duration, e.Err != nil)
				}
			}
			sessions, err := sessFlags.host(dataDir)
			if err != nil {
				return err
			}
			notice, err := noticeFlags.source()
			if err != nil {
				return err
			}
			a, err = agent.New(agent.Config{NodeID: nodeID, RentalID: rentalID, Generation: generation, DataDir: dataDir, EnrollmentToken: token,
				Capacity: capacity, MaxWorkloads: maxWorkloads, ContentRoot: contentRoot, CacheDir: cacheDir, FactsInterval: factsInterval,
				Accelerator: gpuProbeFor(gpuProbe, nvmlLibrary, gpuProbeTimeout, cdiDirs, log), AcceleratorTimeout: gpuProbeTimeout,
				Credentials: creds, Sessions: sessions, LogRate: logRate, LogBurst: logBurst, LogMetrics: logMetrics, ImageMetrics: imageMetrics,
				DiskWatermarks: watermarks, DiskMetrics: diskMetrics, Interruption: notice,
				LogDialer:    newLogDialer(natsURL, nodeID, natsTLS, creds, log),
				NetworkModes: networkModes(rt.NetworkModes(), allowHostNetwork)}, conn, rt, log)
			if err != nil {
				return err
			}
			log.Info("agent starting", zap.String("node_id", nodeID), zap.String("nats", natsURL), zap.String("containerd", ctrdAddr))
			if metricsAddr == "" {
				return a.Run(cmd.Context())
			}
			return runWithMetrics(cmd.Context(), metricsAddr, reg, a, log)
		},
	}
	f := cmd.Flags()
	sessFlags = addSessionFlags(f)
	noticeFlags = addInterruptionFlags(f)
	f.StringVar(&natsURL, "nats-url", envOr("WARMFLEET_NATS_URL", "nats://127.0.0.1:4222"), "NATS server URL the agent dials")
	f.StringVar(&bootstrap, "bootstrap", os.Getenv("WARMFLEET_BOOTSTRAP"), "NodeBootstrap JSON file from `warmfleet node invite`")
	f.StringVar(&nodeID, "node-id", os.Getenv("WARMFLEET_NODE_ID"), "node identity (default: hostname)")
	f.StringVar(&rentalID, "rental-id", "", "rental this node belongs to")
	f.Uint64Var(&generation, "generation", 1, "rental lifecycle generation")
	f.StringVar(&dataDir, "data-dir", "", "journal and logs (default /var/lib/warmfleet-agent/<node-id>)")
	f.StringVar(&ctrdAddr, "containerd-address", containerd.DefaultAddress, "containerd socket")
	f.StringVar(&ctrdNS, "containerd-namespace", containerd.DefaultNamespace, "containerd namespace for warmfleet's images and containers")
	f.StringArrayVar(&insecureRegistries, "insecure-registry", nil, "registry host[:port] pulled from over plain HTTP (repeatable; loopback hosts always are). Credentials the control plane gives for it then cross the network in clear: only on a trusted network")
	f.StringVar(&imageDir, "image-dir", "", "directory of OCI image archives (<digest-hex>.tar) to import before pulling from a registry")
	f.Int64Var(&capacity.CPUMillis, "cpu-millis", 0, "CPU offered to Runs (default: all cores)")
	f.Int64Var(&capacity.MemoryBytes, "memory-bytes", 0, "memory offered to Runs (default: all memory)")
	f.Int64Var(&capacity.GPUCount, "gpus", 0, "GPUs offered to Runs")
	f.IntVar(&maxWorkloads, "max-workloads", 0, "most workloads at once (0: no cap)")
	f.StringVar(&contentRoot, "content-root", "/var/lib/containerd", "containerd's root directory; its filesystem's size and free space are reported as disk facts")
	f.IntVar(&diskHigh, "disk-high-watermark", 85, "percent of the content root's filesystem used past which the agent removes images and caches, least recently used first (0 with --disk-low-watermark 0: never)")
	f.IntVar(&diskLow, "disk-low-watermark", 70, "percent used a collection brings the content root's filesystem down to; below --disk-high-watermark")
	f.StringVar(&cacheDir, "cache-dir", "", "directory holding the caches Runs mount (default <data-dir>/caches)")
	f.DurationVar(&factsInterval, "facts-interval", agent.DefaultFactsInterval, "how often node facts are reported (changes are reported sooner)")
	f.StringVar(&gpuProbe, "gpu-probe", os.Getenv("WARMFLEET_GPU_PROBE"), "the "+gpuprobe.BinaryName+" binary that reports the host's GPUs (default: next to this executable, else on PATH)")
	f.DurationVar(&gpuProbeTimeout, "gpu-probe-timeout", gpuprobe.DefaultTimeout, "how long one GPU probe may take before the GPUs are reported unknown")
	f.StringVar(&nvmlLibrary, "nvml-library", os.Getenv("WARMFLEET_NVML_LIBRARY"), "NVML library the GPU probe loads (default: libnvidia-ml.so.1 from the loader's search path)")
	f.StringSliceVar(&cdiDirs, "cdi-spec-dir", cdispec.DefaultDirs(), "CDI spec directory, lowest priority first; repeat for several. GPUs are given to containers through the devices these specs declare")
	f.BoolVar(&natsAuth, "nats-auth", os.Getenv("WARMFLEET_NATS_AUTH") == "1", "log in to NATS as this node with the bootstrap's token, then the session's (for warmfleet serve --auth; docs/security.md)")
	f.BoolVar(&authWithoutTLS, "insecure-auth-without-tls", false, "let --nats-auth log in over a connection without TLS, where the node's tokens cross in clear (any process that can read this host's traffic, a host-network Run included, may take them)")
	f.StringVar(&natsTLS.CAFile, "tls-ca", os.Getenv("WARMFLEET_NATS_CA"), "CA (PEM) the NATS server's certificate must chain to; turns TLS on (default: the bootstrap's control_plane_ca)")
	f.StringVar(&natsTLS.CertFile, "tls-cert", os.Getenv("WARMFLEET_NATS_CERT"), "client certificate (PEM) for a NATS server that verifies clients")
	f.StringVar(&natsTLS.KeyFile, "tls-key", os.Getenv("WARMFLEET_NATS_KEY"), "client key (PEM)")
	f.BoolVar(&allowHostNetwork, "allow-host-network", false, `let Runs that ask ("network": "host") share this host's network namespace, and so reach every local service this host's network reaches; off, facts do not offer host and such a launch is refused (docs/security.md)`)
	f.StringVar(&netOpts.Bridge, "network-bridge", containerd.DefaultBridge, "Linux bridge that bridged Runs join (created by the CNI bridge plugin)")
	f.StringVar(&netOpts.Subnet, "network-subnet", containerd.DefaultSubnet, "IPv4 subnet of the bridge network; its first address is the bridge's")
	f.StringVar(&netOpts.IPAMDir, "network-ipam-dir", "", "host-local IPAM's data dir (default <data-dir>/runtime/ipam); agents sharing one bridge must share it")
	f.StringSliceVar(&netOpts.PluginDirs, "cni-plugin-dir", containerd.DefaultCNIPluginDirs(), "directories holding the CNI plugins bridge, host-local and loopback")
	f.StringVar(&netOpts.ResolvConf, "resolv-conf", "", "file copied into Runs as /etc/resolv.conf (default /etc/resolv.conf, or /run/systemd/resolve/resolv.conf behind systemd-resolved's stub)")
	f.Int64Var(&logRate, "log-rate", agent.DefaultLogRate, "bytes per second of one Run's output kept (stdout and stderr together); past it output is dropped and a marker line says how much; -1: no limit")
	f.Int64Var(&logBurst, "log-burst", agent.DefaultLogBurst, "bytes of one Run's output kept at once above --log-rate")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&metricsAddr, "metrics-addr", os.Getenv("WARMFLEET_METRICS_ADDR"), "serve Prometheus /metrics, /healthz and /readyz (ready once enrolled) on this host:port (default: off)")
	return cmd
}

// gpuProbeFor is the accelerator probe: the GPU probe binary, its CDI
// names from the specs in cdiDirs. A binary that cannot be found is logged
// here and at each report, which then states nothing established.
func gpuProbeFor(path, nvmlLibrary string, timeout time.Duration, cdiDirs []string, log *zap.Logger) *gpuprobe.Exec {
	bin, err := gpuprobe.Locate(path)
	if err != nil {
		log.Warn("GPU probe binary not found; GPUs will be reported unknown", zap.Error(err))
	}
	var args []string
	if nvmlLibrary != "" {
		args = append(args, "--nvml-library="+nvmlLibrary)
	}
	return gpuprobe.NewExec(gpuprobe.ExecConfig{Path: bin, Args: args, Timeout: timeout, CDI: cdispec.New(cdiDirs, log), Log: log})
}

// runWithMetrics runs the agent with its metrics server beside it: the
// process and Go collectors plus its session (enrolled, fencing token).
// A metrics server that fails stops the agent too, and its error is
// returned.
func runWithMetrics(ctx context.Context, addr string, reg *prometheus.Registry, a *agent.Agent, log *zap.Logger) error {
	ln, err := metrics.Listen(addr)
	if err != nil {
		return err
	}
	log.Info("metrics listening", zap.String("addr", ln.Addr().String()))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		err := metrics.ServeListener(ctx, ln, reg, func() bool { return metrics.Enrolled(a.Enrollment()) })
		if err != nil {
			log.Error("metrics server stopped", zap.Error(err))
			cancel()
		}
		done <- err
	}()
	runErr := a.Run(ctx)
	cancel()
	if err := <-done; err != nil {
		return err
	}
	return runErr
}

// networkModes are the modes the agent offers Runs: what the runtime can
// give, less host networking unless the operator allowed it.
func networkModes(rt []noderuntime.NetworkMode, allowHost bool) []string {
	out := []string{}
	for _, m := range rt {
		if m != noderuntime.NetworkHost || allowHost {
			out = append(out, string(m))
		}
	}
	return out
}

// diskWatermarks checks the watermark flags: both 1..99 with low below
// high, or both 0 to turn collection off.
func diskWatermarks(high, low int) (*schemas.DiskWatermarks, error) {
	if high == 0 && low == 0 {
		return nil, nil
	}
	w := schemas.DiskWatermarks{High: high, Low: low}
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("--disk-high-watermark %d --disk-low-watermark %d: %w", high, low, err)
	}
	return &w, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// checkAuthTransport refuses --nats-auth over a connection without TLS
// (no CA, certificate or tls:// URL) unless --insecure-auth-without-tls
// says so: the node's tokens would cross the wire in clear.
func checkAuthTransport(auth, override bool, url string, t bus.TLSFiles, log *zap.Logger) error {
	if !auth || t.Enabled() || allTLSURLs(url) {
		return nil
	}
	if !override {
		return &schemas.Refusal{Code: schemas.CodeTLSRequired, Field: "--nats-auth", Reason: fmt.Sprintf(
			"logging in to %s without TLS sends this node's tokens in clear: use a bootstrap from `warmfleet node invite` against a server with TLS (it carries the CA), or pass --tls-ca, or --insecure-auth-without-tls to send them anyway", url)}
	}
	log.Warn("--nats-auth without TLS (--insecure-auth-without-tls): the node's tokens cross the network in clear", zap.String("nats", url))
	return nil
}

// allTLSURLs reports whether every URL in a comma-separated list is tls://.
func allTLSURLs(list string) bool {
	for _, u := range strings.Split(list, ",") {
		if !strings.HasPrefix(strings.TrimSpace(u), "tls://") {
			return false
		}
	}
	return true
}

// readBootstrap reads a NodeBootstrap file strictly; its token is a secret
// and is never printed.
func readBootstrap(path string) (schemas.NodeBootstrap, error) {
	var b schemas.NodeBootstrap
	data, err := os.ReadFile(path)
	if err != nil {
		return b, fmt.Errorf("--bootstrap: %w", err)
	}
	if err := codec.Decode(codec.JSON, data, &b); err != nil {
		return b, fmt.Errorf("--bootstrap %s: not a NodeBootstrap: %w", path, err)
	}
	if err := schemas.ValidateID("node_id", b.NodeID, schemas.CodeMalformed); err != nil {
		return b, fmt.Errorf("--bootstrap %s: %w", path, err)
	}
	return b, nil
}
