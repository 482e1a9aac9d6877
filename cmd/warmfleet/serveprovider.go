package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/fake"
	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/adapters/capacity/runpod"
	"github.com/warmfleet/warmfleet/adapters/capacity/runpodserverless"
	"github.com/warmfleet/warmfleet/adapters/capacity/shadeform"
	"github.com/warmfleet/warmfleet/controlplane/lane"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/internal/ctrdproc"
)

// serveCapacity is `warmfleet serve`'s capacity provider configuration:
// which adapter rents machines when no node fits, and its settings. Each
// setting comes from its flag, else the --provider-config JSON file (keys
// are the flag names), else the environment variable named in its help,
// else the default. Credentials are never flags: the Shadeform key comes
// from SHADEFORM_API_KEY or a key file, and is never logged.
type serveCapacity struct {
	provider, configFile, ownership, connection string
	providersFile                               string
	maxRentals                                  int
	idle, maxLifetime, rentMargin, readyEst     time.Duration
	enrollTimeout, spotPenalty                  time.Duration
	spotRate                                    float64

	localAgent, localDir, localPrice string
	localContainerd                  string
	localArgs                        []string
	localCPU, localMemory, localGPUs int64
	localStopResume                  bool

	fakeSeed uint64

	sfKeyFile, sfBaseURL, sfOS, sfSSHKey string

	rpKeyFile, rpBaseURL, rpGraphQLURL, rpImage, rpCloud string
	rpGPUCounts                                          []int

	rpsKeyFile, rpsBaseURL string
}

// providerEnv maps a flag to the environment variable that may set it.
var providerEnv = map[string]string{
	"provider": "WARMFLEET_PROVIDER", "providers-file": "WARMFLEET_PROVIDERS_FILE", "ownership-token": "WARMFLEET_OWNERSHIP_TOKEN", "provider-config": "WARMFLEET_PROVIDER_CONFIG",
	"shadeform-api-key-file": "SHADEFORM_API_KEY_FILE", "shadeform-base-url": "SHADEFORM_BASE_URL",
	"runpod-api-key-file": "RUNPOD_API_KEY_FILE", "runpod-serverless-api-key-file": "RUNPOD_SERVERLESS_API_KEY_FILE",
}

func (c *serveCapacity) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&c.provider, "provider", "", "rent machines when no node fits (or a fresh one beats the queue): local, fake, shadeform or runpod (env WARMFLEET_PROVIDER; default: none)")
	f.StringVar(&c.providersFile, "providers-file", "", "JSON-lines file of provider connections, one per line: "+
		`{"id": "sf", "type": "shadeform", "credentials_file": "/etc/warmfleet/shadeform.key", "max_rentals": 4, "settings": {"shadeform-os": "…"}}; `+
		"offers are compared across them, --max-rentals bounds them all (env WARMFLEET_PROVIDERS_FILE; instead of --provider)")
	f.StringVar(&c.configFile, "provider-config", "", "JSON file of provider settings, keyed by these flags' names without the dashes' prefix, e.g. {\"max-rentals\": 2, \"shadeform-os\": \"ubuntu22.04_cuda12.2_shade_os\"} (env WARMFLEET_PROVIDER_CONFIG)")
	f.StringVar(&c.ownership, "ownership-token", "", "marks every machine this deployment rents; the janitor touches only machines carrying it (env WARMFLEET_OWNERSHIP_TOKEN; default warmfleet-<connection-id>)")
	f.StringVar(&c.connection, "connection-id", "default", "names this provider connection in rentals and owned-capacity listings")
	f.IntVar(&c.maxRentals, "max-rentals", 4, "most machines rented at once")
	f.DurationVar(&c.idle, "idle-timeout", 10*time.Minute, "retire a rental whose node had no Run this long (stopped where the provider can resume it warm, else terminated)")
	f.DurationVar(&c.maxLifetime, "max-lifetime", 0, "provider-side lifetime backstop for rented machines, where supported (0: none)")
	f.DurationVar(&c.rentMargin, "rent-margin", time.Minute, "rent past a queue only when a fresh machine starts the Run this much sooner (negative: never)")
	f.DurationVar(&c.enrollTimeout, "enroll-timeout", 20*time.Minute, "give up (terminate) a rented machine whose agent has not enrolled this long after it last changed state")
	f.DurationVar(&c.readyEst, "ready-estimate", 3*time.Minute, "time to ready assumed for an offer whose provider states none")
	f.DurationVar(&c.spotPenalty, "spot-penalty", 30*time.Minute, "leave a spot pool (region and card) out this long after one of its machines was interrupted (negative: never)")
	f.Float64Var(&c.spotRate, "spot-interruption-rate", 0.05, "chance an interruptible machine is taken back within an hour, assumed for an offer whose provider states none (0 < rate < 1)")
	f.StringVar(&c.localAgent, "local-agent", "", "local: the warmfleet-agent binary (default: the one beside this binary)")
	f.StringVar(&c.localDir, "local-dir", "", "local: where machines keep their bootstrap, data dir and log (default <data-dir>/machines)")
	f.StringArrayVar(&c.localArgs, "local-agent-arg", nil, "local: extra warmfleet-agent flag, repeatable (e.g. --local-agent-arg=--containerd-address=/run/containerd/containerd.sock)")
	f.Int64Var(&c.localCPU, "local-cpu-millis", 2000, "local: CPU each machine offers")
	f.Int64Var(&c.localMemory, "local-memory-bytes", 4<<30, "local: memory each machine offers")
	f.Int64Var(&c.localGPUs, "local-gpus", 0, "local: GPUs each machine offers")
	f.StringVar(&c.localPrice, "local-price", "0.01", "local: what a machine costs, dollars per hour (for placement to weigh)")
	f.StringVar(&c.localContainerd, "local-containerd", "auto", "local: per-machine (each machine runs its own containerd, root, state and socket under its directory: its images survive stop and start, terminate removes them), "+
		"shared (every machine uses the daemon --local-agent-arg=--containerd-address names, or the agent's default, in a namespace of its own) "+
		"or auto (per-machine when running as root with containerd, runc and containerd-shim-runc-v2 on PATH and no --containerd-address among --local-agent-arg; else shared)")
	f.BoolVar(&c.localStopResume, "local-stop-resume", true, "local: retire idle machines by stopping their agent and keeping its data dir, and resume them when needed")
	f.Uint64Var(&c.fakeSeed, "fake-seed", 1, "fake: the seed of the simulated world (its machines run no agent: a dry run of the rental lifecycle)")
	f.StringVar(&c.sfKeyFile, "shadeform-api-key-file", "", "shadeform: file holding the API key (env SHADEFORM_API_KEY_FILE; else the key from SHADEFORM_API_KEY)")
	f.StringVar(&c.sfBaseURL, "shadeform-base-url", "", "shadeform: API root (env SHADEFORM_BASE_URL; default "+shadeform.DefaultBaseURL+")")
	f.StringVar(&c.sfOS, "shadeform-os", "", "shadeform: OS image for new instances")
	f.StringVar(&c.sfSSHKey, "shadeform-ssh-key-id", "", "shadeform: SSH key id for new instances")
	f.StringVar(&c.rpKeyFile, "runpod-api-key-file", "", "runpod: file holding the API key (env RUNPOD_API_KEY_FILE; else the key from RUNPOD_API_KEY)")
	f.StringVar(&c.rpBaseURL, "runpod-base-url", "", "runpod: REST API root (default "+runpod.DefaultBaseURL+")")
	f.StringVar(&c.rpGraphQLURL, "runpod-graphql-url", "", "runpod: GraphQL endpoint for the gpu catalogue (default "+runpod.DefaultGraphQLURL+")")
	f.StringVar(&c.rpImage, "runpod-image", "", "runpod: the pod image, one whose entrypoint runs warmfleet-agent with the bootstrap from WARMFLEET_BOOTSTRAP (required)")
	f.StringVar(&c.rpCloud, "runpod-cloud-type", "SECURE", "runpod: SECURE, COMMUNITY or ALL: which prices offers quote")
	f.IntSliceVar(&c.rpGPUCounts, "runpod-gpu-counts", []int{1}, "runpod: pod sizes offered per gpu type, in cards")
	f.StringVar(&c.rpsKeyFile, "runpod-serverless-api-key-file", "", "runpod-serverless (providers file only): file holding the API key")
	f.StringVar(&c.rpsBaseURL, "runpod-serverless-base-url", "", "runpod-serverless (providers file only): API root (default "+runpodserverless.DefaultBaseURL+")")
}

// resolve fills every flag not given on the command line from the config
// file, then from the environment.
// setFromJSON sets a flag from a JSON value, as the command line would:
// each element of an array is one occurrence of the flag; a number is
// written without an exponent.
func setFromJSON(flags *pflag.FlagSet, name string, raw json.RawMessage) error {
	var one any
	if err := json.Unmarshal(raw, &one); err != nil {
		return err
	}
	vals, ok := one.([]any)
	if !ok {
		vals = []any{one}
	}
	for _, v := range vals {
		s := fmt.Sprint(v)
		if f, ok := v.(float64); ok {
			s = strconv.FormatFloat(f, 'f', -1, 64)
		}
		if err := flags.Set(name, s); err != nil {
			return err
		}
	}
	return nil
}

func (c *serveCapacity) resolve(flags *pflag.FlagSet, getenv func(string) string) error {
	fromEnv := func(name string) error {
		if flags.Changed(name) {
			return nil
		}
		if v := getenv(providerEnv[name]); v != "" && providerEnv[name] != "" {
			return flags.Set(name, v)
		}
		return nil
	}
	if err := fromEnv("provider-config"); err != nil {
		return err
	}
	if c.configFile != "" {
		b, err := os.ReadFile(c.configFile)
		if err != nil {
			return fmt.Errorf("provider config: %w", err)
		}
		onCommandLine := map[string]bool{}
		flags.Visit(func(f *pflag.Flag) { onCommandLine[f.Name] = true })
		var file map[string]json.RawMessage
		if err := json.Unmarshal(b, &file); err != nil {
			return fmt.Errorf("provider config %s: not a JSON object: %w", c.configFile, err)
		}
		for name, raw := range file {
			fl := flags.Lookup(name)
			if fl == nil || !providerFlag(name) || strings.Contains(name, "api-key") && !strings.HasSuffix(name, "-file") {
				return fmt.Errorf("provider config %s: %q is not a provider setting", c.configFile, name)
			}
			if onCommandLine[name] {
				continue // the command line wins
			}
			if err := setFromJSON(flags, name, raw); err != nil {
				return fmt.Errorf("provider config %s: %s: %w", c.configFile, name, err)
			}
		}
	}
	for name := range providerEnv {
		if err := fromEnv(name); err != nil {
			return err
		}
	}
	return nil
}

// providerFlag reports whether a flag is one of serveCapacity's.
func providerFlag(name string) bool {
	switch name {
	case "provider", "providers-file", "ownership-token", "connection-id", "max-rentals", "idle-timeout", "max-lifetime", "rent-margin", "ready-estimate",
		"enroll-timeout", "fake-seed", "spot-penalty", "spot-interruption-rate":
		return true
	}
	return strings.HasPrefix(name, "local-") || strings.HasPrefix(name, "shadeform-") || strings.HasPrefix(name, "runpod-")
}

// build returns the control plane's rental and ephemeral-lane
// configurations (each nil when nothing configures it), and what to run
// once the control plane stopped: the local provider terminates its
// machines then, so no agent process outlives the serve that started it.
func (c *serveCapacity) build(ctx context.Context, flags *pflag.FlagSet, dataDir string, log *zap.Logger) (*rentals.Config, *lane.Config, func(), error) {
	cc, lc, locals, err := c.provide(ctx, flags, dataDir, log)
	if err != nil {
		return nil, nil, func() {}, err
	}
	return cc, lc, func() {
		for _, lp := range locals {
			if err := shutdownLocal(lp); err != nil {
				log.Warn("local machines: shutdown", zap.Error(err))
			}
		}
	}, nil
}

func (c *serveCapacity) provide(ctx context.Context, flags *pflag.FlagSet, dataDir string, log *zap.Logger) (*rentals.Config, *lane.Config, []*local.Provider, error) {
	if err := c.resolve(flags, os.Getenv); err != nil {
		return nil, nil, nil, err
	}
	if c.maxRentals <= 0 {
		return nil, nil, nil, errors.New("--max-rentals must be 1 or more")
	}
	if !(c.spotRate > 0 && c.spotRate < 1) {
		return nil, nil, nil, fmt.Errorf("--spot-interruption-rate %v: want a chance between 0 and 1, exclusive", c.spotRate)
	}
	cfg := &rentals.Config{MaxRentals: c.maxRentals, IdleTimeout: c.idle, MaxLifetime: c.maxLifetime, RentMargin: c.rentMargin, ReadyEstimate: c.readyEst,
		EnrollTimeout: c.enrollTimeout, SpotPenalty: c.spotPenalty, SpotInterruptionRate: c.spotRate}
	switch {
	case c.providersFile != "" && c.provider != "":
		return nil, nil, nil, fmt.Errorf("--provider %q and --providers-file %q: give one (a providers file names every connection)", c.provider, c.providersFile)
	case c.providersFile != "":
		got, err := loadProviders(ctx, c.providersFile, dataDir, log)
		if err != nil {
			return nil, nil, nil, err
		}
		log.Info("provider connections configured", zap.String("providers_file", c.providersFile), zap.Int("capacity", len(got.rentals)),
			zap.Int("ephemeral_lane", len(got.lane)), zap.Int("max_rentals", c.maxRentals))
		var lc *lane.Config
		if len(got.lane) > 0 {
			lc = &lane.Config{Connections: got.lane}
		}
		if len(got.rentals) == 0 {
			return nil, lc, got.locals, nil
		}
		cfg.Connections = got.rentals
		return cfg, lc, got.locals, nil
	case c.provider == "":
		return nil, nil, nil, nil
	}
	p, lp, err := c.providerOf(ctx, dataDir, log)
	if err != nil {
		return nil, nil, nil, err
	}
	vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.Verify(vctx); err != nil {
		return nil, nil, nil, errors.Join(fmt.Errorf("provider %s: %w", c.provider, err), shutdownLocal(lp))
	}
	log.Info("capacity provider configured", zap.String("provider", c.provider), zap.String("connection_id", c.connection),
		zap.Any("support", p.Support()), zap.Int("max_rentals", c.maxRentals))
	cfg.Connections = []rentals.Connection{{ID: c.connection, Provider: p, OwnershipToken: capacity.OwnershipTokenFor(c.connection, c.ownership)}}
	var locals []*local.Provider
	if lp != nil {
		locals = append(locals, lp)
	}
	return cfg, nil, locals, nil
}

// providerOf builds the adapter c.provider names from c's settings; lp is
// set when it is the local provider, whose machines end with serve.
func (c *serveCapacity) providerOf(ctx context.Context, dataDir string, log *zap.Logger) (p capacity.Provider, lp *local.Provider, err error) {
	switch c.provider {
	case "local":
		agentPath := c.localAgent
		if agentPath == "" {
			self, err := os.Executable()
			if err != nil {
				return nil, nil, fmt.Errorf("local provider: find warmfleet-agent: %w", err)
			}
			agentPath = filepath.Join(filepath.Dir(self), "warmfleet-agent")
		}
		if _, err := os.Stat(agentPath); err != nil {
			return nil, nil, fmt.Errorf("local provider: agent binary: %w (build it with `make build` or give --local-agent)", err)
		}
		dir := c.localDir
		if dir == "" {
			dir = filepath.Join(dataDir, "machines")
		}
		price, err := strconv.ParseFloat(c.localPrice, 64)
		if err != nil || price < 0 {
			return nil, nil, fmt.Errorf("local provider: --local-price %q is not a non-negative number of dollars", c.localPrice)
		}
		perMachine, why, err := localContainerdMode(c.localContainerd, c.localArgs, ctrdproc.Check)
		if err != nil {
			return nil, nil, err
		}
		log.Info("local machines' containerd", zap.String("connection_id", c.connection), zap.Bool("per_machine", perMachine), zap.String("why", why))
		var opts []local.Option
		if c.localStopResume {
			opts = append(opts, local.WithStopResume())
		}
		lp = local.New(local.ExecLauncher(local.ExecConfig{AgentPath: agentPath, Dir: dir, Args: c.localArgs, ContainerdPerMachine: perMachine,
			Log: log.Named("local")}),
			capacity.Offer{ID: "local", CPUMillis: c.localCPU, MemoryBytes: c.localMemory, GPUCount: c.localGPUs, ReadySeconds: 2,
				PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: int64(price * 1e6), Exact: true}}, opts...)
		return lp, lp, nil
	case "fake":
		fp, err := fake.New(fake.Config{Seed: c.fakeSeed, Clock: wallClock{}, ConnectionID: c.connection, Latency: fake.DefaultLatency()})
		return fp, nil, err
	case "shadeform":
		sp, err := shadeform.New(shadeform.Config{ConnectionID: c.connection, BaseURL: c.sfBaseURL, APIKeyFile: c.sfKeyFile,
			Logger: log.Named("shadeform"), OS: c.sfOS, SSHKeyID: c.sfSSHKey})
		return sp, nil, err
	case "runpod":
		rp, err := runpod.New(runpod.Config{ConnectionID: c.connection, BaseURL: c.rpBaseURL, GraphQLURL: c.rpGraphQLURL, APIKeyFile: c.rpKeyFile,
			Logger: log.Named("runpod"), Image: c.rpImage, CloudType: c.rpCloud, GPUCounts: c.rpGPUCounts})
		return rp, nil, err
	}
	return nil, nil, fmt.Errorf("--provider %q: want %s", c.provider, strings.Join(providerTypes, ", "))
}

// providerTypes are the adapters serve can rent from.
var providerTypes = []string{"local", "fake", "shadeform", "runpod"}

// shutdownLocal ends a local provider's machines (nil: nothing to end).
func shutdownLocal(lp *local.Provider) error {
	if lp == nil {
		return nil
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return lp.Shutdown(sctx)
}

// localContainerdMode decides whether each local machine runs its own
// containerd (--local-containerd), and says why. An explicit per-machine
// that cannot be honoured is an error, not a quiet fallback.
func localContainerdMode(mode string, agentArgs []string, check func() error) (perMachine bool, why string, err error) {
	named := local.NamesContainerdAddress(agentArgs)
	switch mode {
	case "per-machine":
		if named {
			return false, "", fmt.Errorf("--local-containerd per-machine: %w", local.ErrContainerdAddressGiven)
		}
		if err := check(); err != nil {
			return false, "", fmt.Errorf("--local-containerd per-machine: %w", err)
		}
		return true, "asked for", nil
	case "shared":
		return false, "asked for", nil
	case "auto", "":
		if named {
			return false, "--local-agent-arg names a --containerd-address", nil
		}
		if err := check(); err != nil {
			return false, err.Error(), nil
		}
		return true, "running as root with containerd and runc on PATH", nil
	}
	return false, "", fmt.Errorf("--local-containerd %q: want per-machine, shared or auto", mode)
}

// wallClock is the fake world's clock for a running control plane: its
// latencies play out in real time.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }
