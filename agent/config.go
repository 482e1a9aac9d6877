package agent

import (
	"fmt"
	"github.com/warmfleet/warmfleet/agent/interruption"
	"net/http"
	"path/filepath"
	"time"

	"github.com/warmfleet/warmfleet/agent/disk"
	"github.com/warmfleet/warmfleet/agent/output"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Version is the agent build reported at enrollment.
const Version = "0.1.0"

// Config describes one node agent.
type Config struct {
	NodeID     string
	RentalID   string
	Generation uint64
	// EnrollmentToken is the bootstrap secret; it is sent once and never
	// logged. After enrolling, the agent resumes with its saved session.
	EnrollmentToken string
	// DataDir holds the operation journal.
	DataDir string
	// Capacity is what this node offers; zero fields are filled from facts.
	Capacity     schemas.Resources
	MaxWorkloads int
	// StopGrace is used when the node itself stops a workload (max runtime).
	StopGrace time.Duration
	// ContentRoot is the filesystem holding the runtime's content (e.g.
	// /var/lib/containerd), measured for disk facts; empty states disk unknown.
	ContentRoot string
	// CacheDir holds the caches Runs mount; <DataDir>/caches when empty.
	CacheDir string
	// ArtifactDir holds the node's artifact replicas (agent/artifactstore);
	// <DataDir>/artifacts when empty.
	ArtifactDir string
	// ArtifactHTTP fetches artifacts from URL sources; nil uses a client
	// that bounds the wait for a response but not the transfer.
	ArtifactHTTP *http.Client
	// Accelerator measures the host's cards (adapters/gpuprobe runs
	// cmd/warmfleet-gpu-probe); nil states nothing established.
	Accelerator AcceleratorProbe
	// AcceleratorTimeout bounds one accelerator probe in a facts report;
	// DefaultAcceleratorTimeout when zero.
	AcceleratorTimeout time.Duration
	// FactsInterval is how often facts are reported; DefaultFactsInterval
	// when zero. Changes (an image ensured, a workload exited) report sooner.
	FactsInterval time.Duration
	// ProgressInterval is how often an image transfer under way is
	// reported; DefaultProgressInterval when zero.
	ProgressInterval time.Duration
	Now              func() time.Time
	// Faults injects crashes for fault tests; nil in production.
	Faults *Faults
	// Sessions hosts resident sessions (residency/nodehost); nil hosts none.
	Sessions noderuntime.SessionHost
	// NetworkModes are the network modes this node gives Runs (values of
	// noderuntime.NetworkMode), reported in facts; a launch asking for
	// another is refused. Nil offers every mode but host: host networking
	// is given only where the operator named it.
	NetworkModes []string
	// LogRate and LogBurst bound how fast one Run's output is kept, both
	// streams together (bytes per second, bytes); past them output is
	// dropped and a marker line says how much. DefaultLogRate and
	// DefaultLogBurst when zero; a negative LogRate keeps everything.
	LogRate, LogBurst int64
	// LogPoll is how often a running attempt's output is read for new
	// lines; DefaultLogPoll when zero.
	LogPoll time.Duration
	// LogRefusedWait is the longest wait between refused log logins of a
	// Run's output before refusals have gone on long (10s when zero).
	LogRefusedWait time.Duration
	// LogShipTimeout bounds how long an exit report waits for the attempt's
	// output to be stored; DefaultLogShipTimeout when zero. Shipping goes
	// on after it.
	LogShipTimeout time.Duration
	// LogDialer opens each Run's log connection; nil ships on the agent's
	// own connection.
	LogDialer LogDialer
	// LogMetrics, when set, receives the shipping figures.
	LogMetrics LogMetrics
	// ImageMetrics, when set, receives image fetch and credential timings.
	ImageMetrics ImageMetrics
	// DiskWatermarks, when set, turn on disk collection: past High percent
	// of ContentRoot's filesystem used, the agent removes images and
	// caches least recently used first until at most Low percent is used
	// (agent/disk). Nil collects nothing on its own; a prune still works.
	DiskWatermarks *schemas.DiskWatermarks
	// DiskMetrics, when set, counts evictions.
	DiskMetrics DiskMetrics
	// Credentials, when set, are what the agent's NATS connection logs in
	// with (NATS auth on; see bus/auth.go and docs/security.md). The agent
	// puts its saved session token, or else its bootstrap token, in them
	// before enrolling, and its new session token after, reconnecting each
	// time. They must be the ones the connection was built with
	// (Credentials.Options). Nil: the connection needs no login.
	Credentials *bus.Credentials
	// Interruption, when set, is watched once per heartbeat for the
	// provider's notice that it is taking the machine back
	// (agent/interruption); the first notice rides every heartbeat after.
	Interruption interruption.Source
	// ArtifactTransport is how an artifact login's own connection reaches
	// NATS (bus.DialArtifactLogin); nil: the main connection's servers and
	// TLS (bus.TransportOf).
	ArtifactTransport *bus.Transport
}

// Faults are the crash points fault tests use to prove invariant 1 (one
// operation id, one effect) across a real agent restart.
type Faults struct {
	// LeaveUnacked is consulted after a command's effect, journal entry and
	// receipt: returning true leaves it unacked, as if the process died
	// before acking, so JetStream redelivers it after AckWait.
	LeaveUnacked func(schemas.Command) bool
	// SkipJournal is consulted after a command's effect: returning true
	// drops the journal entry and the ack, as if the process died between
	// the effect and the journal write.
	SkipJournal func(schemas.Command) bool
}

// Defaults for Config's output fields.
const (
	DefaultLogRate  = 1 << 20 // bytes per second, per Run
	DefaultLogBurst = 8 << 20
	// DefaultLogPoll is how often a running attempt's files are read.
	DefaultLogPoll = 100 * time.Millisecond
	// DefaultLogShipTimeout bounds how long an exit report waits for the
	// attempt's output to be stored (NATS down, a log login refused).
	DefaultLogShipTimeout = 2 * time.Minute
)

// LogDialer opens the connection one Run's output is shipped on and returns
// it with its closer (output.Dialer). With NATS auth on,
// cmd/warmfleet-agent dials a login that may publish only that Run's log
// subject.
type LogDialer = output.Dialer

// LogMetrics receives the shipping figures (output.Metrics;
// internal/metrics.AgentLogs implements it).
type LogMetrics = output.Metrics

// DiskMetrics receives each eviction (disk.Metrics; internal/metrics
// implements it).
type DiskMetrics = disk.Metrics

// withDefaults fills cfg's unset fields and checks its watermarks.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = schemas.DefaultGraceSeconds * time.Second
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(cfg.DataDir, "caches")
	}
	if cfg.ArtifactDir == "" {
		cfg.ArtifactDir = filepath.Join(cfg.DataDir, "artifacts")
	}
	if cfg.FactsInterval <= 0 {
		cfg.FactsInterval = DefaultFactsInterval
	}
	if cfg.AcceleratorTimeout <= 0 {
		cfg.AcceleratorTimeout = DefaultAcceleratorTimeout
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = DefaultProgressInterval
	}
	if cfg.LogRate == 0 {
		cfg.LogRate = DefaultLogRate
	}
	if cfg.LogBurst <= 0 {
		cfg.LogBurst = DefaultLogBurst
	}
	if cfg.LogPoll <= 0 {
		cfg.LogPoll = DefaultLogPoll
	}
	if cfg.LogShipTimeout <= 0 {
		cfg.LogShipTimeout = DefaultLogShipTimeout
	}
	if w := cfg.DiskWatermarks; w != nil {
		if err := w.Validate(); err != nil {
			return cfg, fmt.Errorf("agent: disk watermarks: %w", err)
		}
	}
	return cfg, nil
}

// PrepareOutput creates the output directory of a Run's attempt under an
// agent's data dir, with what it needs to be shipped, and returns it
// (output.PrepareRun). An agent starting on dataDir ships every such
// directory its runtime holds no workload for (the benchmark uses this to
// feed it output).
func PrepareOutput(dataDir, tenant, runID, attemptID string) (string, error) {
	return output.PrepareRun(dataDir, tenant, runID, attemptID)
}
